"""The ``narwhal serve --workers N`` supervisor at the two moments chance used to decide: each
test drives one of them directly, in a real supervisor (a subprocess forking real workers), so
it holds on every run rather than on a lucky one.

- A worker seen dead before its death is looked for: the supervisor used to drop a worker that
  its pass's first look found already exited, and then waited forever on the others. A worker
  killed during startup gets there; so does one SIGKILLed while serving, when the supervisor's
  wake-up (the worker's pipe closing) comes a moment before the kernel lets it be reaped.
- A SIGTERM reaching a worker between its fork and its own signal dispositions: the worker
  used to run the supervisor's handler it was forked with, which swallowed the signal, so a
  stop waited out the SIGKILL deadline (and a worker told nothing else served on).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BOUND_S = 30.0  # each driver exits within a second once correct

# Worker 1 exits at once with status 3; worker 0 serves (pauses) until its SIGTERM. Supervision
# begins only once worker 1 can be reaped (waitid WNOWAIT looks without reaping it), so the
# supervisor's first look at its workers is the one that finds worker 1 dead.
DEAD_BEFORE_FIRST_LOOK = """
import os, signal, sys, time
from narwhal.live.workers import Supervisor
from narwhal.serving import bind

def entry(sock, index):
    if index == 1:
        os._exit(3)
    signal.pause()

class LateFirstLook(Supervisor):
    def start(self):
        super().start()
        pid, deadline = self.workers[1].pid, time.monotonic() + 20.0
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() > deadline:
                sys.exit("worker 1 did not exit within 20 s")
            time.sleep(0.01)

sys.exit(LateFirstLook(bind("127.0.0.1", 0), 2, entry, graceful_s=1.0).run())
"""

# Each worker is sent SIGTERM right after its fork, before its own dispositions (the hook runs
# in the child as multiprocessing sets it up); both then serve (pause) until a signal ends them.
SIGTERM_BEFORE_DISPOSITIONS = """
import os, signal, sys
from multiprocessing import util
from narwhal.live.workers import Supervisor
from narwhal.serving import bind

class Hook:
    pass

HOOK = Hook()
util.register_after_fork(HOOK, lambda hook: os.kill(os.getpid(), signal.SIGTERM))

def entry(sock, index):
    signal.pause()

sys.exit(Supervisor(bind("127.0.0.1", 0), 2, entry, graceful_s=1.0).run())
"""


def supervise(driver: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-c", driver],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=BOUND_S,
        )
    except subprocess.TimeoutExpired as timeout:
        err = timeout.stderr.decode() if isinstance(timeout.stderr, bytes) else timeout.stderr
        pytest.fail(f"the supervisor did not exit within {BOUND_S} s; its stderr: {err!r}")


def test_a_worker_dead_before_the_first_look_stops_the_router() -> None:
    done = supervise(DEAD_BEFORE_FIRST_LOOK)
    assert done.returncode == 1, done.stderr
    assert "worker narwhal-worker-1 (pid " in done.stderr
    assert "exited with status 3; stopping the others" in done.stderr
    assert "narwhal-worker-0" not in done.stderr  # stopped when asked: not a failure


def test_a_sigterm_before_the_workers_own_dispositions_is_not_lost() -> None:
    done = supervise(SIGTERM_BEFORE_DISPOSITIONS)
    assert done.returncode == 1, done.stderr
    # delivered once the worker's own SIG_DFL is in place: each worker ends on it, and the
    # supervisor sees workers that exited while nobody asked
    assert "exited with status -15; stopping the others" in done.stderr
