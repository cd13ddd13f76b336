"""Where ``narwhal serve`` takes its API key from, and the empty key it refuses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.live.commands import API_KEY_ENV, resolve_api_key


def test_a_file_the_flag_or_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    env = {API_KEY_ENV: "from-env"}
    assert resolve_api_key(None, str(key_file), env) == "from-file"  # newline stripped
    assert resolve_api_key("from-flag", None, env) == "from-flag"
    assert resolve_api_key(None, None, env) == "from-env"
    assert resolve_api_key(None, None, {}) is None  # no key given: auth off, as documented


@pytest.mark.parametrize(
    ("flag", "content", "env", "named"),
    [
        ("", None, {}, "--api-key"),
        (None, "  \n", {}, "--api-key-file"),
        (None, None, {API_KEY_ENV: ""}, f"${API_KEY_ENV}"),
    ],
)
def test_an_empty_key_is_refused_not_taken_as_no_key(
    tmp_path: Path, flag: str | None, content: str | None, env: dict[str, str], named: str
) -> None:
    path = None
    if content is not None:
        (tmp_path / "key").write_text(content)
        path = str(tmp_path / "key")
    with pytest.raises(ValueError, match=re.escape(named) + ".* empty API key"):
        resolve_api_key(flag, path, env)


def test_serve_refuses_an_unreadable_or_empty_key_before_listening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "narwhal.toml"
    config.write_text('[[engines]]\nurl = "http://127.0.0.1:9"\nrole = "both"\n')
    missing = str(tmp_path / "absent")
    assert main(["serve", "--config", str(config), "--api-key-file", missing]) == 2
    assert "cannot read" in capsys.readouterr().err
    monkeypatch.setenv(API_KEY_ENV, "")
    assert main(["serve", "--config", str(config)]) == 2
    assert "empty API key" in capsys.readouterr().err
