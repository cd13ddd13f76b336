"""``narwhal serve`` as a process: stdout is the JSON request log and nothing else."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import tomli_w

from narwhal.serving import bind, port_of
from tests.compiled_stage import EXPECTED_BUILD
from tests.live.conftest import HTTP, Emulator

REPO = Path(__file__).resolve().parents[2]


def test_stdout_holds_only_json_lines_and_people_read_stderr(
    tmp_path: Path, emulator: Callable[..., Emulator]
) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    config = tmp_path / "narwhal.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "engines": [
                    {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
                    {"url": consumer.url, "role": "decode"},
                ]
            }
        )
    )
    sock = bind("127.0.0.1", 0)
    port = port_of(sock)
    sock.close()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "narwhal.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
            "--graceful-s",
            "1",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if HTTP.get(url + "/livez", timeout=1).status_code == 200:
                    break
            except Exception:
                assert time.monotonic() < deadline, "narwhal serve did not come up"
                time.sleep(0.05)
        for _ in range(2):
            reply = HTTP.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert reply.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    lines = [json.loads(line) for line in out.splitlines()]  # every stdout line is JSON
    assert [line["event"] for line in lines] == ["router", "request", "request"]
    # the router line: the fleet and settings a replay starts from (narwhal replay)
    assert [e["url"] for e in lines[0]["engines"]] == [producer.url, consumer.url]
    assert lines[0]["recovery"]["eject_after"] == 3
    # what a replay needs of each prompt, never its text
    assert {(r["prompt_bytes"], r["max_tokens"], tuple(r["prefix"])) for r in lines[1:]} == {
        (2, 2, ())
    }
    assert f"listening on http://127.0.0.1:{port}" in err and producer.url in err
    assert f"(api key off, {EXPECTED_BUILD} build)" in err  # which build serves


def test_serve_takes_the_fleet_from_prefill_and_decode_urls_without_a_file(
    emulator: Callable[..., Emulator],
) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    sock = bind("127.0.0.1", 0)
    port = port_of(sock)
    sock.close()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "narwhal.cli",
            "serve",
            "--prefill",
            producer.url,
            "--decode",
            consumer.url,
            "--port",
            str(port),
            "--graceful-s",
            "1",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if HTTP.get(url + "/livez", timeout=1).status_code == 200:
                    break
            except Exception:
                assert time.monotonic() < deadline, "narwhal serve did not come up"
                time.sleep(0.05)
        reply = HTTP.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert reply.status_code == 200
        engines = HTTP.get(url + "/status").json()["engines"]
        assert [(e["url"], e["role"]) for e in engines] == [
            (producer.url, "prefill"),
            (consumer.url, "decode"),
        ]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert producer.state()["requests"] == 1 and consumer.state()["requests"] == 1


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "narwhal.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_fleet_on_the_command_line_is_checked_as_a_file_is(tmp_path: Path) -> None:
    bad = run_cli("serve", "--prefill", "http://127.0.0.1:8100", "--decode", "127.0.0.1:8200")
    assert bad.returncode == 2 and bad.stdout == ""
    assert (
        "--decode: must be an http(s) URL like 'http://127.0.0.1:8100', got "
        "'127.0.0.1:8200'" in bad.stderr
    )
    half = run_cli("preflight", "--prefill", "http://127.0.0.1:8100")
    assert half.returncode == 2 and "no engine can decode" in half.stderr
    neither = run_cli("serve")
    assert neither.returncode == 2
    assert (
        "give either --config FILE or --prefill URL and --decode URL (got neither)"
        in neither.stderr
    )
    config = tmp_path / "narwhal.toml"
    config.write_text("")
    both = run_cli("serve", "--config", str(config), "--decode", "http://127.0.0.1:8200")
    assert both.returncode == 2 and "(got both)" in both.stderr


def test_a_kv_event_endpoint_that_cannot_be_dialled_is_refused_with_the_key(
    tmp_path: Path,
) -> None:
    config = tmp_path / "narwhal.toml"
    config.write_text(tomli_w.dumps({
        "routing": {"decode": "kv_aware"},
        "engines": [
            {"url": "http://127.0.0.1:9", "role": "prefill"},
            {"url": "http://127.0.0.1:10", "role": "decode", "kv_events": "tcp://*:5557"},
        ],
    }))  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "narwhal.cli", "serve", "--config", str(config), "--port", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert "engines[1].kv_events" in done.stderr and "tcp://*:5557" in done.stderr
    assert "Traceback" not in done.stderr
