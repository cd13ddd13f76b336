"""Reading TOML files (``narwhal.config_file``): a file that cannot be used is refused naming
the file and the reason, in the caller's error type; a good file validates into a config."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.config_file import config_from_urls, load_config, parse_toml, read_toml
from narwhal.core.config import ConfigError, Role, parse_config

CONFIG = """
[engine_contract]
model = "tiny-llama"
vllm_version = "0.32.0"
[[engines]]
url = "http://127.0.0.1:8100/"
role = "both"
"""


class SpecProblem(ValueError):
    """A caller's own error type."""


def test_a_config_file_loads_and_validates(tmp_path: Path) -> None:
    path = tmp_path / "narwhal.toml"
    path.write_text(CONFIG, "utf-8")
    config = load_config(path)
    assert config.engines[0].url == "http://127.0.0.1:8100"
    assert config.engines[0].role is Role.BOTH


def test_a_bad_key_in_a_file_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(CONFIG + "[recovery]\neject_aftr = 2\n", "utf-8")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(path) in str(error.value)
    assert "recovery.eject_aftr: unknown key" in str(error.value)


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read configuration .*absent\.toml"):
        load_config(tmp_path / "absent.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[engine\n", "utf-8")
    with pytest.raises(ConfigError, match=r"invalid TOML in .*broken\.toml"):
        load_config(broken)
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b"[engine]\nfirst_token_timeout_s = 5.0 # caf\xe9\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 42\)"):
        load_config(latin1)


def test_the_callers_error_type_and_words_are_used(tmp_path: Path) -> None:
    with pytest.raises(SpecProblem, match="cannot read sweep spec"):
        read_toml(tmp_path / "absent.toml", "sweep spec", SpecProblem)
    with pytest.raises(SpecProblem, match="invalid TOML in <text>"):
        parse_toml("a = ", "<text>", SpecProblem)
    assert parse_toml("a = 1\n[b]\nc = 'd'\n", "<text>", SpecProblem) == {"a": 1, "b": {"c": "d"}}


def test_a_fleet_of_urls_is_the_configuration_a_file_of_them_would_be() -> None:
    given = config_from_urls(["http://p1:8100", "http://p2:8100/"], ["http://d:8200"])
    written = parse_config(
        parse_toml(
            '[[engines]]\nurl = "http://p1:8100"\nrole = "prefill"\n'
            '[[engines]]\nurl = "http://p2:8100"\nrole = "prefill"\n'
            '[[engines]]\nurl = "http://d:8200"\nrole = "decode"\n',
            "f",
            ConfigError,
        )
    )
    assert given == written
    both = config_from_urls(["http://e:8100"], ["http://e:8100"])  # one engine, both roles
    assert [(e.url, e.role.value) for e in both.engines] == [("http://e:8100", "both")]
    with pytest.raises(ConfigError, match=r"--prefill: port out of range"):
        config_from_urls(["http://e:0"], ["http://d:8200"])
    with pytest.raises(ConfigError, match=r"url 'http://e:8100' is listed more than once"):
        config_from_urls(["http://e:8100", "http://E:8100"], ["http://d:8200"])
