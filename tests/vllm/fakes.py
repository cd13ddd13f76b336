"""Stand-ins for the vLLM venv in the default run: a fake ``vllm`` whose API server spawns a
child (the EngineCore stand-in) and answers ``GET /health``, and a fake venv's ``python``."""

from __future__ import annotations

import sys
from pathlib import Path

FAKE_VLLM = """\
import http.server, os, subprocess, sys, time
if os.environ.get("FAKE_VLLM_FAIL"):
    print("fake vllm: refusing to start", flush=True)
    sys.exit(3)
port = int(sys.argv[sys.argv.index("--port") + 1])
model = sys.argv[2]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.path.join(model, f"child-{port}.pid"), "w") as f:
    f.write(str(child.pid))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def fake_venv(root: Path) -> Path:
    """A folder shaped like the vLLM venv: ``bin/vllm`` is :data:`FAKE_VLLM` and ``bin/python``
    this test's own Python (which has no torch)."""
    (root / "bin").mkdir(parents=True)
    vllm = root / "bin" / "vllm"
    vllm.write_text(f"#!{sys.executable}\n{FAKE_VLLM}")
    python = root / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for script in (vllm, python):
        script.chmod(0o755)
    return root
