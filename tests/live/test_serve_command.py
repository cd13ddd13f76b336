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
    config.write_text(tomli_w.dumps({"engines": [
        {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
        {"url": consumer.url, "role": "decode"},
    ]}))
    sock = bind("127.0.0.1", 0)
    port = port_of(sock)
    sock.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "narwhal.cli", "serve", "--config", str(config),
         "--port", str(port), "--graceful-s", "1"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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
    assert [line["event"] for line in lines] == ["request", "request"]
    assert f"listening on http://127.0.0.1:{port}" in err and producer.url in err
    assert f"(api key off, {EXPECTED_BUILD} build)" in err  # which build serves
