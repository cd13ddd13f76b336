"""Reloading a running router's configuration file: on SIGHUP, and when the file changes.

Rule kept here: this module only reads the file and hands what it read to the core
(:meth:`~narwhal.core.policies.Policies.reconfigure`, or
:meth:`~narwhal.core.policies.Policies.reload_invalid` when the file cannot be read or does
not validate); what a reload may change, and how the fleet moves, is decided in
:mod:`narwhal.core.fleet_changes`. A file that cannot be used changes nothing.

Theory of operation: :meth:`ConfigReloader.run` is one loop in the router's task group. It
wakes when a reload is requested (SIGHUP, whose handler it installs on the running loop when
told to, or :meth:`ConfigReloader.request`) and at least every :data:`SETTLE_TICK_S`: each
turn it lets the core forget the draining engines that hold nothing, says which joining
engines have joined, and every ``poll_s`` compares the file's fingerprint (modification time,
size, inode) with the last one read; when that changed and the content's SHA-256 differs too,
the file is reloaded (a file watch, so that a discovery process can rewrite the engine list;
it should replace the file atomically, by a rename). The file is read off the event loop and at
most :data:`MAX_CONFIG_BYTES` of it. Every outcome is said in one line (stderr under
``narwhal serve``) and recorded by the core as a ``reload`` decision, which the metrics count
(``narwhal_config_reloads_total{result}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path

import anyio

from narwhal.config_file import config_from_bytes
from narwhal.core.breaker import EngineState
from narwhal.core.config import ConfigError, NarwhalConfig
from narwhal.core.fleet_changes import Reload
from narwhal.core.policies import Policies
from narwhal.live.clock import AnyioClock

MAX_CONFIG_BYTES = 1 << 20  # a configuration file larger than this is refused, unread
SETTLE_TICK_S = 0.25  # how often drains are finished and joins reported
DEFAULT_POLL_S = 2.0

log = logging.getLogger("narwhal.live")

Fingerprint = tuple[int, int, int] | None  # (mtime_ns, size, inode); None: cannot be stat'ed


def fingerprint(path: Path) -> Fingerprint:
    try:
        found = path.stat()
    except OSError:
        return None
    return (found.st_mtime_ns, found.st_size, found.st_ino)


def read_bounded(path: Path) -> bytes:
    """The file's bytes, or :class:`ConfigError` (unreadable, or over MAX_CONFIG_BYTES)."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as problem:
        raise ConfigError(
            f"cannot read configuration {path}: {problem.strerror or problem}"
        ) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"configuration {path} is larger than {MAX_CONFIG_BYTES} bytes")
    return data


class ConfigReloader:
    """Reloads one router's configuration file when asked and when it changes."""

    def __init__(
        self,
        path: str | Path,
        policies: Policies,
        clock: AnyioClock,
        *,
        poll_s: float = DEFAULT_POLL_S,
        sighup: bool = False,
        say: Callable[[str], None] | None = None,
        on_config: Callable[[NarwhalConfig], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._on_config = on_config  # called with the configuration in force after a reload
        self._policies = policies
        self._clock = clock
        self._poll_s = poll_s  # 0: no file watch (SIGHUP and request() only)
        self._sighup = sighup
        self._say = say if say is not None else log.warning
        # what the router started from (read at start, so a change from now on is seen)
        self._seen = fingerprint(self.path)
        self._digest: bytes | None = None
        with contextlib.suppress(ConfigError):
            self._digest = hashlib.sha256(read_bounded(self.path)).digest()
        self._requested = anyio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._joining: set[str] = set()
        self.last: Reload | None = None

    def request(self) -> None:
        """Ask for a reload now (what the SIGHUP handler calls; on the router's loop)."""
        self._requested.set()

    def request_from_thread(self) -> None:
        """:meth:`request`, from another thread (tests, embedding)."""
        if self._loop is None:
            raise RuntimeError("the reloader is not running")
        self._loop.call_soon_threadsafe(self.request)

    async def reload(self) -> Reload:
        """Read the file and hand it to the core; say and return what happened."""
        self._seen = fingerprint(self.path)
        now = self._clock.now()
        try:
            data = await anyio.to_thread.run_sync(read_bounded, self.path)
            self._digest = hashlib.sha256(data).digest()
            config = config_from_bytes(data, self.path)
        except ConfigError as error:
            outcome = self._policies.reload_invalid(str(error).replace("\n", " "), now)
        else:
            outcome = self._policies.reconfigure(config, self._clock.now())
        self._joining.update(outcome.added)
        self._joining.difference_update(outcome.removed)
        self.last = outcome
        self._say(f"narwhal: reload of {self.path}: {outcome.summary()}")
        if self._on_config is not None:
            self._on_config(self._policies.config)
        return outcome

    async def run(self, *, stop: Callable[[], bool]) -> None:
        """The loop (module docstring) until ``stop()``."""
        self._loop = asyncio.get_running_loop()
        installed = self._sighup and self._install_sighup()
        next_poll = self._clock.now() + self._poll_s
        try:
            while not stop():
                with anyio.move_on_after(SETTLE_TICK_S):
                    await self._requested.wait()
                now = self._clock.now()
                self._settle(now)
                if self._requested.is_set():
                    self._requested = anyio.Event()
                    await self.reload()
                elif self._poll_s > 0 and now >= next_poll:
                    next_poll = now + self._poll_s
                    if await self.changed():
                        await self.reload()
        finally:
            if installed:
                self._loop.remove_signal_handler(signal.SIGHUP)

    async def changed(self) -> bool:
        """Whether the file differs from the last one read (a new fingerprint and a new
        digest; a touched file with the same content is not reloaded)."""
        seen = fingerprint(self.path)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            data = await anyio.to_thread.run_sync(read_bounded, self.path)
        except ConfigError:
            return True  # gone or unreadable: reload says why
        return hashlib.sha256(data).digest() != self._digest

    def _settle(self, now: float) -> None:
        for url in self._policies.settle(now):
            self._say(f"narwhal: engine {url} drained and removed")
        breaker = self._policies.breaker
        for url in sorted(self._joining):
            if breaker.state(url, now) is not EngineState.JOINING:
                self._joining.discard(url)
                self._say(f"narwhal: engine {url} joined (its probe passed)")

    def _install_sighup(self) -> bool:
        assert self._loop is not None
        if not hasattr(signal, "SIGHUP"):
            return False
        try:
            self._loop.add_signal_handler(signal.SIGHUP, self.request)
        except (NotImplementedError, RuntimeError, ValueError) as error:  # not the main thread
            self._say(f"narwhal: SIGHUP does not reload here ({error})")
            return False
        return True
