"""Configuration: the documented names and defaults; bad mappings refused naming the key."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from narwhal.core.config import (
    ConfigError,
    EngineContract,
    EngineEntry,
    NarwhalConfig,
    Role,
    parse_config,
    valid_keys,
)

FULL = """
[engine]
first_token_timeout_s = 30.0
decode_read_timeout_s = 10.0
request_timeout_s = 600.0
max_handoff_age_s = 25.0
[recovery]
eject_after = 3
failure_quarantine_s = 0.0
max_attempts = 1
retry_budget_ratio = 0.2
retry_budget_min = 3
probe_interval_s = 5.0
probe_decode_tokens = 8
[engine_contract]
model = "tiny-llama"
vllm_version = "0.32.0"
kv_connector = "NixlConnector"
[[engines]]
url = "http://127.0.0.1:8100"
role = "prefill"
kv_endpoint = "127.0.0.1:5559"
[[engines]]
url = "http://127.0.0.1:8200/"
role = "decode"
"""

FLEET = {"engines": [{"url": "http://127.0.0.1:1", "role": "both"}]}


def test_documented_example_validates() -> None:
    cfg = parse_config(tomllib.loads(FULL))
    assert cfg.engines[0].kv_endpoint == "127.0.0.1:5559"
    assert cfg.engines[1].url == "http://127.0.0.1:8200"
    assert cfg.engines[1].role is Role.DECODE
    assert cfg.engine_contract is not None and cfg.kv_connector == "NixlConnector"


def test_documented_defaults() -> None:
    cfg = parse_config(FLEET)
    assert (
        cfg.engine.first_token_timeout_s,
        cfg.engine.decode_read_timeout_s,
        cfg.engine.request_timeout_s,
        cfg.engine.max_handoff_age_s,
    ) == (30, 10, 600, 25)
    r = cfg.recovery
    assert (
        r.eject_after,
        r.failure_quarantine_s,
        r.max_attempts,
        r.retry_budget_ratio,
        r.retry_budget_min,
        r.probe_interval_s,
        r.probe_decode_tokens,
    ) == (3, 0.0, 1, 0.2, 3, 5.0, 8)
    assert cfg.engine_contract is None


@pytest.mark.parametrize(
    ("patch", "key", "reason"),
    [
        ({"recovery": {"eject_after": 0}}, "recovery.eject_after", "greater than or equal to 1"),
        ({"recovery": {"eject_afte": 2}}, "recovery.eject_afte", "unknown key"),
        ({"engine": {"first_token_timeout_s": -1}}, "engine.first_token_timeout_s", "greater than"),
        (
            {"engine": {"decode_read_timeout_s": "10s"}},
            "engine.decode_read_timeout_s",
            "valid number",
        ),
        ({"recovery": {"retry_budget_ratio": 1.5}}, "recovery.retry_budget_ratio", "less than"),
        ({"engines": [{"url": "127.0.0.1:8100", "role": "both"}]}, "engines[0].url", "http(s) URL"),
        ({"engines": [{"url": "http://a", "role": "prefiller"}]}, "engines[0].role", "prefill"),
        (
            {"engines": [{"url": "http://a", "role": "both", "kv_endpoint": "host"}]},
            "engines[0].kv_endpoint",
            "host:port",
        ),
        ({"engines": []}, "engines", "at least 1"),
        (
            {"engines": [{"url": "http://a", "role": "prefill"}]},
            "(top level)",
            "no engine can decode",
        ),
        (
            {"engine_contract": {"model": "m", "vllm_version": "1", "kv_connector": "Foo"}},
            "engine_contract.kv_connector",
            "unknown connector",
        ),
        ({"engine_contract": {"model": "m"}}, "engine_contract.vllm_version", "missing"),
        (
            {
                "engines": [
                    {"url": "http://a", "role": "both"},
                    {"url": "http://a/", "role": "both"},
                ]
            },
            "(top level)",
            "more than once",
        ),
        (
            {
                "engines": [
                    {"url": "HTTP://A:80", "role": "both"},
                    {"url": "http://a:80/", "role": "both"},
                ]
            },
            "(top level)",
            "more than once",
        ),
        ({"engines": [{"url": "http://a:99999", "role": "both"}]}, "engines[0].url", "1-65535"),
        ({"recovery": {"probe_interval_s": 1e-9}}, "recovery.probe_interval_s", "0.01"),
        ({"recovery": {"probe_decode_tokens": 0}}, "recovery.probe_decode_tokens", "1"),
        ({"recovery": {"probe_decode_tokens": 257}}, "recovery.probe_decode_tokens", "256"),
        ({"engines": [{"url": "http://a:0", "role": "both"}]}, "engines[0].url", "1-65535"),
        ({"engines": [{"url": "http://a b:80", "role": "both"}]}, "engines[0].url", "valid host"),
        (
            {"engines": [{"url": "http://u:pw@a:80", "role": "both"}]},
            "engines[0].url",
            "must not carry credentials",
        ),
    ],
)
def test_bad_config_names_key_and_reason(patch: dict, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config({**FLEET, **patch}, "fleet.toml")
    message = str(error.value)
    assert "fleet.toml" in message
    line = next(line for line in message.splitlines() if line.strip().startswith(key + ":"))
    assert reason in line


def test_missing_engines_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"engines: required key is missing"):
        parse_config({})


def test_engine_urls_are_normalised() -> None:
    cfg = parse_config({"engines": [{"url": " HTTP://LocalHost:8100/ ", "role": "both"}]})
    assert cfg.engines[0].url == "http://localhost:8100"
    ipv6 = parse_config({"engines": [{"url": "http://[::1]:8100", "role": "both"}]})
    assert ipv6.engines[0].url == "http://[::1]:8100"


ROUTING = """
[routing]
prefill = "prefix_affinity"
decode = "least_loaded"
[routing.least_loaded]
max_report_age_s = 1.5
waiting_weight = 2
running_weight = 0.5
kv_cache_weight = 0
[routing.prefix_affinity]
block_size = 32
max_blocks_per_engine = 1000
imbalance_threshold = 0
[[engines]]
url = "http://127.0.0.1:8100"
role = "both"
"""


def test_routing_table_loads() -> None:
    routing = parse_config(tomllib.loads(ROUTING)).routing
    assert (routing.prefill, routing.decode) == ("prefix_affinity", "least_loaded")
    loaded = routing.least_loaded
    assert (loaded.max_report_age_s, loaded.waiting_weight, loaded.running_weight) == (1.5, 2, 0.5)
    assert loaded.kv_cache_weight == 0
    affinity = routing.prefix_affinity
    assert (affinity.block_size, affinity.max_blocks_per_engine) == (32, 1000)
    assert affinity.imbalance_threshold == 0


def test_routing_defaults() -> None:
    routing = parse_config(FLEET).routing
    assert (routing.prefill, routing.decode) == ("least_reserved", "least_reserved")
    loaded, affinity = routing.least_loaded, routing.prefix_affinity
    assert (loaded.max_report_age_s, loaded.waiting_weight) == (2.0, 1.0)
    assert (loaded.running_weight, loaded.kv_cache_weight) == (1.0, 1.0)
    assert (affinity.block_size, affinity.max_blocks_per_engine) == (16, 32_768)
    assert affinity.imbalance_threshold == 2


@pytest.mark.parametrize(
    ("routing", "key", "reason"),
    [
        ({"prefill": "cache_aware"}, "routing.prefill", "'least_reserved', 'round_robin'"),
        ({"decode": "Random"}, "routing.decode", "'prefix_affinity'"),
        ({"decode": 1}, "routing.decode", "'least_reserved'"),
        ({"both": "random"}, "routing.both", "unknown key"),
        ({"least_loaded": {"max_report_age_s": 0}}, "routing.least_loaded.max_report_age_s",
         "greater than or equal to 0.001"),
        ({"least_loaded": {"max_report_age_s": "2s"}}, "routing.least_loaded.max_report_age_s",
         "valid number"),
        ({"least_loaded": {"waiting_weight": -1}}, "routing.least_loaded.waiting_weight",
         "greater than or equal to 0"),
        ({"least_loaded": {"kv_cache_weight": True}}, "routing.least_loaded.kv_cache_weight",
         "(got True)"),
        ({"least_loaded": {"running_weight": float("inf")}},
         "routing.least_loaded.running_weight", "finite"),
        ({"least_loaded": {"wait_weight": 1}}, "routing.least_loaded.wait_weight", "unknown key"),
        ({"prefix_affinity": {"block_size": 0}}, "routing.prefix_affinity.block_size",
         "greater than or equal to 1"),
        ({"prefix_affinity": {"block_size": 16.0}}, "routing.prefix_affinity.block_size",
         "valid integer"),
        ({"prefix_affinity": {"max_blocks_per_engine": 0}},
         "routing.prefix_affinity.max_blocks_per_engine", "greater than or equal to 1"),
        ({"prefix_affinity": {"max_blocks_per_engine": 10**8}},
         "routing.prefix_affinity.max_blocks_per_engine", "less than or equal to 10000000"),
        ({"prefix_affinity": {"imbalance_threshold": -1}},
         "routing.prefix_affinity.imbalance_threshold", "greater than or equal to 0"),
        ({"round_robin": {}}, "routing.round_robin", "unknown key"),
    ],
)  # fmt: skip
def test_bad_routing_names_key_and_reason(routing: dict, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config({**FLEET, "routing": routing}, "fleet.toml")
    lines = str(error.value).splitlines()
    line = next(line for line in lines if line.strip().startswith(key + ":"))
    assert reason in line, line


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (
            {"recovery": {"eject_afte": 2}, "engines": [{"url": "http://a", "role": "both"}]},
            "recovery.eject_afte: unknown key (check the spelling against the configuration "
            "reference); valid keys: eject_after, failure_quarantine_s, max_attempts, "
            "max_ejection_percent, max_resumes, panic_threshold_percent, probe_backoff_cap, "
            "probe_decode_tokens, probe_interval_s, resume_max_seq_len, resume_streams, "
            "retry_budget_min, retry_budget_ratio",
        ),
        (  # an array of tables: the element's keys
            {"engines": [{"url": "http://a", "role": "both", "colour": "red"}]},
            "engines[0].colour: unknown key (check the spelling against the configuration "
            "reference); valid keys: kv_endpoint, kv_events, kv_events_replay, kv_events_topic, "
            "role, url",
        ),
        (  # two tables deep
            {
                "routing": {"prefix_affinity": {"blocksize": 4}},
                "engines": [{"url": "http://a", "role": "both"}],
            },
            "routing.prefix_affinity.blocksize: unknown key (check the spelling against the "
            "configuration reference); valid keys: block_size, imbalance_threshold, "
            "max_blocks_per_engine",
        ),
    ],
)
def test_an_unknown_key_lists_the_valid_ones(data: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert f"  {line}" in str(caught.value).splitlines()


def test_the_valid_keys_are_the_models_fields_at_every_level() -> None:
    assert valid_keys(NarwhalConfig, ()) == sorted(NarwhalConfig.model_fields)
    assert valid_keys(NarwhalConfig, ("engines", 3)) == sorted(EngineEntry.model_fields)
    assert valid_keys(NarwhalConfig, ("engine_contract",)) == sorted(EngineContract.model_fields)
    assert valid_keys(NarwhalConfig, ("recovery", "eject_after")) is None  # not a table


DISAGGREGATION = """
[routing]
remote_prefill_min_tokens = 256
no_producer = "local"
[routing.least_loaded]
scrape_interval_s = 0.25
[[engines]]
url = "http://127.0.0.1:8100"
role = "both"
"""


def test_disaggregation_and_scrape_keys_load_and_default_to_the_old_behaviour() -> None:
    routing = parse_config(tomllib.loads(DISAGGREGATION)).routing
    assert (routing.remote_prefill_min_tokens, routing.no_producer) == (256, "local")
    assert routing.least_loaded.scrape_interval_s == 0.25
    defaults = parse_config(FLEET).routing
    assert (defaults.remote_prefill_min_tokens, defaults.no_producer) == (0, "fail")
    assert defaults.least_loaded.scrape_interval_s == 0.5


@pytest.mark.parametrize(
    ("routing", "key", "reason"),
    [
        ({"remote_prefill_min_tokens": -1}, "routing.remote_prefill_min_tokens",
         "greater than or equal to 0"),
        ({"remote_prefill_min_tokens": 1.5}, "routing.remote_prefill_min_tokens",
         "valid integer"),
        ({"remote_prefill_min_tokens": "512"}, "routing.remote_prefill_min_tokens",
         "valid integer"),
        ({"no_producer": "remote"}, "routing.no_producer", "'fail' or 'local'"),
        ({"least_loaded": {"scrape_interval_s": 0}}, "routing.least_loaded.scrape_interval_s",
         "greater than or equal to 0.001"),
        ({"least_loaded": {"scrape_interval_s": 2.0}}, "routing.least_loaded",
         "scrape_interval_s (2) must be below max_report_age_s (2)"),
        ({"least_loaded": {"max_report_age_s": 0.4}}, "routing.least_loaded",
         "scrape_interval_s (0.5) must be below max_report_age_s (0.4)"),
    ],
)  # fmt: skip
def test_bad_disaggregation_or_scrape_keys_name_the_key(
    routing: dict, key: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config({**FLEET, "routing": routing}, "fleet.toml")
    lines = str(error.value).splitlines()
    line = next(line for line in lines if line.strip().startswith(key + ":"))
    assert reason in line, line


def test_client_write_timeout_default_zero_off_and_refusals() -> None:
    assert parse_config(FLEET).client.write_timeout_s == 30.0
    assert parse_config({**FLEET, "client": {"write_timeout_s": 0}}).client.write_timeout_s == 0
    for bad, reason in [
        (True, "valid number"),
        ("30", "valid number"),
        (float("inf"), "finite number"),
        (-1, "greater than or equal to 0"),
        (0.0005, "0 (off) or at least 0.001 s"),
        (1e6, "less than or equal to 86400"),
    ]:
        with pytest.raises(ConfigError) as error:
            parse_config({**FLEET, "client": {"write_timeout_s": bad}})
        line = next(x for x in str(error.value).splitlines() if "client.write_timeout_s:" in x)
        assert reason in line, (bad, line)
    with pytest.raises(ConfigError, match=r"client\.write_timout_s: unknown key"):
        parse_config({**FLEET, "client": {"write_timout_s": 1}})
