"""``narwhal serve --workers N``: one supervisor, one listening socket, N router processes.

Rule kept here: the workers share nothing but the listening socket. Each is a whole router
(its own :class:`~narwhal.core.policies.Policies`: breaker, quarantine, retry budget,
admission bound, reservations, prefix index; its own probes, health checks, reloads and
metrics), so every consequence docs/live.md ("Beyond one core") lists follows: an engine is
ejected by a worker after that worker saw ``recovery.eject_after`` failures, and so on. The
supervisor decides nothing about traffic; it binds, starts, forwards signals and stops.

Theory of operation:

- The supervisor binds the port once (:func:`narwhal.serving.bind`; port 0 gives one port,
  known at once) and forks N workers that inherit that one listening socket, all accepting on
  it. One shared socket rather than ``SO_REUSEPORT`` (a socket per worker, the kernel hashing
  each connection onto one): connections waiting in the accept queue belong to the socket, not
  to a worker, so a worker that stops or dies loses none of them to a reset, and a busy worker
  is simply slower to accept, so idle workers take more of the new connections. (A client's
  keep-alive connection stays with the worker that accepted it.)
- Signals: the workers run in their own process group, so a terminal's Ctrl-C reaches only the
  supervisor, which forwards SIGINT, SIGTERM and SIGHUP to every worker exactly once per
  signal (the supervisor decides when a worker is told, and a worker is never told twice by
  the terminal and the supervisor). SIGHUP makes each worker reload the configuration file on
  its own. Workers are forked with those signals blocked until they have set their own
  dispositions, so a SIGTERM sent to a worker still starting up ends it rather than being
  swallowed by the supervisor's handler it was forked with.
- A worker that exits while nobody asked it to is a failure, however early (during startup
  too): the supervisor stops the others (SIGTERM, the graceful drain) and exits with status 1,
  leaving the restart to the process manager (systemd, Kubernetes) that restarts the whole
  router. Restarting a worker in place would hand its share of traffic to a fresh breaker that
  has forgotten every ejection. Each pass of the supervisor looks once at every worker and
  decides from that one look, so a worker is either waited on or reported, never dropped.
- Every wait is bounded: workers get ``--graceful-s`` plus :data:`STOP_MARGIN_S` to exit after
  SIGTERM, then SIGKILL. A worker whose supervisor is gone (killed with SIGKILL) notices within
  :data:`ORPHAN_CHECK_S` and stops itself gracefully.
- ``/metrics`` and ``/status`` are per worker: a scrape lands on whichever worker accepts the
  connection and reports that worker's counters and its view of the fleet. Each worker's
  metrics carry ``narwhal_worker{worker="k",pid="..."}`` so a scrape says who answered.

:func:`serve_worker` is the one call that serves a router on an inherited socket: it is what
a change of HTTP server re-points.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from narwhal import build
from narwhal.core.config import NarwhalConfig
from narwhal.core.policies import replica_seed

MAX_WORKERS = 64
STOP_MARGIN_S = 5.0  # past --graceful-s, how long a worker may take to exit before SIGKILL
ORPHAN_CHECK_S = 1.0  # how often a worker checks that its supervisor is alive
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

WorkerEntry = Callable[[socket.socket, int], None]


def startup_note(api_key: str | None) -> str:
    """What the startup line says of the router beside its address, one process or N workers
    alike (``narwhal serve`` prints it here or in :func:`serve_workers`): auth and build."""
    return f"(api key {'required' if api_key else 'off'}, {build()} build)"


def serve_worker(
    args: argparse.Namespace,
    config: NarwhalConfig,
    api_key: str | None,
    sock: socket.socket,
    index: int,
) -> None:
    """Serve one router on the inherited listening ``sock`` until told to stop (the body of
    ``narwhal serve`` after it has bound, with worker ``index``'s policy seed)."""
    from prometheus_client import Gauge

    from narwhal.live.app import Router
    from narwhal.live.reporting import StdoutRequestLog
    from narwhal.live.serving import make_router_server

    router = Router(
        config,
        seed=replica_seed(args.seed, index),
        api_key=api_key,
        announce=lambda line: print(f"[worker {index}] {line}", file=sys.stderr, flush=True),
        config_path=args.config,
        reload_poll_s=args.reload_poll_s,
        reload_on_sighup=True,
        request_log=StdoutRequestLog(),
    )
    Gauge(
        "narwhal_worker",
        "Which worker of `narwhal serve --workers N` answered this scrape (always 1)",
        ["worker", "pid"],
        registry=router.metrics.registry,
    ).labels(str(index), str(os.getpid())).set(1)
    server = make_router_server(router, client=config.client, graceful_s=args.graceful_s)
    server.run([sock])


def _watch_supervisor(supervisor: int) -> None:
    """In a worker: once the supervisor is gone (this process re-parented), stop gracefully."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(ORPHAN_CHECK_S):
            if os.getppid() != supervisor:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, daemon=True, name="narwhal-orphan-watch").start()


def _worker_main(entry: WorkerEntry, sock: socket.socket, index: int, supervisor: int) -> None:
    os.setpgid(0, 0)  # out of the terminal's group: signals come from the supervisor, once
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the reload loop takes it
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)  # until the server installs its own
    # Blocked since before the fork (Supervisor.start): one that came meanwhile is delivered
    # now, to these dispositions, not to the supervisor's handler this process was forked with.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    _watch_supervisor(supervisor)
    entry(sock, index)


class Supervisor:
    """N worker processes serving one listening socket (see the module's theory)."""

    def __init__(
        self, sock: socket.socket, count: int, entry: WorkerEntry, *, graceful_s: float
    ) -> None:
        if not 1 <= count <= MAX_WORKERS:
            raise ValueError(f"--workers must be within 1..{MAX_WORKERS}, not {count}")
        self.sock = sock
        self.count = count
        self.entry = entry
        self.stop_timeout_s = graceful_s + STOP_MARGIN_S
        self.workers: list[BaseProcess] = []
        self._context = multiprocessing.get_context("fork")

    def start(self) -> None:
        """Fork the workers with the forwarded signals blocked: a child starts with the
        supervisor's handlers, which would swallow a SIGTERM sent to it before
        :func:`_worker_main` resets them (a stop then waiting out the SIGKILL deadline)."""
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        try:
            for index in range(self.count):
                process = self._context.Process(
                    target=_worker_main,
                    args=(self.entry, self.sock, index, os.getpid()),
                    name=f"narwhal-worker-{index}",
                    daemon=False,
                )
                process.start()
                self.workers.append(process)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)

    def forward(self, signum: int) -> None:
        """Send ``signum`` to every worker still running."""
        for process in self.workers:
            if process.pid is not None and process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    def stop(self) -> None:
        """SIGTERM every worker, wait (bounded) for them to drain, SIGKILL what is left."""
        self.forward(signal.SIGTERM)
        self._join(self.stop_timeout_s)
        for process in self.workers:
            if process.exitcode is None:
                process.kill()
        self._join(STOP_MARGIN_S)

    def _join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for process in self.workers:
            process.join(max(0.0, deadline - time.monotonic()))

    def run(self) -> int:
        """Start the workers and supervise them until a forwarded SIGINT/SIGTERM has stopped
        them all (0) or one exited on its own (1: the others are stopped first)."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        received: list[int] = []

        def on_signal(signum: int, frame: Any) -> None:
            received.append(signum)
            with contextlib.suppress(BlockingIOError):  # the pipe is full of wake-ups already
                os.write(wake_w, b"\0")

        previous = {signum: signal.signal(signum, on_signal) for signum in FORWARDED}
        try:
            self.start()
            return self._supervise(wake_r, received)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            os.close(wake_r)
            os.close(wake_w)

    def _supervise(self, wake_r: int, received: list[int]) -> int:
        stop_by: float | None = None  # once stopping: when stragglers get SIGKILL
        while True:
            # One look at each worker per pass, and every decision below comes from that look: a
            # worker is either waited on or reported dead, never dropped between the two. (The
            # moment a worker is first seen to have exited is chance: its sentinel is readable
            # a moment before the kernel lets it be reaped, so it can be seen here on any pass,
            # or before the first one when it died during startup.)
            running = [p for p in self.workers if p.exitcode is None]
            dead = [p for p in self.workers if p not in running]
            if stop_by is None and dead:
                for process in dead:
                    print(
                        f"narwhal: worker {process.name} (pid {process.pid}) exited with "
                        f"status {process.exitcode}; stopping the others",
                        file=sys.stderr,
                        flush=True,
                    )
                self.stop()
                return 1
            if not running:
                return 0
            timeout = None if stop_by is None else max(0.0, stop_by - time.monotonic())
            ready = wait([wake_r, *(p.sentinel for p in running)], timeout)
            if stop_by is not None and time.monotonic() >= stop_by:
                for process in running:
                    process.kill()
                self._join(STOP_MARGIN_S)
                return 0
            if wake_r in ready:
                os.read(wake_r, 4096)
                while received:
                    signum = received.pop(0)
                    self.forward(signum)
                    if signum != signal.SIGHUP and stop_by is None:
                        stop_by = time.monotonic() + self.stop_timeout_s


def serve_workers(args: argparse.Namespace, config: NarwhalConfig, api_key: str | None) -> int:
    """``narwhal serve --workers N``: bind once, run N workers, supervise; the exit status."""
    from narwhal.serving import bind, port_of

    try:
        supervisor_sock = bind(args.host, args.port)
    except OSError as error:
        print(f"narwhal: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1

    def entry(sock: socket.socket, index: int) -> None:
        serve_worker(args, config, api_key, sock, index)

    try:
        supervisor = Supervisor(supervisor_sock, args.workers, entry, graceful_s=args.graceful_s)
    except ValueError as error:
        print(f"narwhal serve: {error}", file=sys.stderr)
        supervisor_sock.close()
        return 2
    print(
        f"narwhal: listening on http://{args.host}:{port_of(supervisor_sock)} with "
        f"{args.workers} workers {startup_note(api_key)}",
        file=sys.stderr,
        flush=True,
    )
    try:
        return supervisor.run()
    finally:
        supervisor_sock.close()
