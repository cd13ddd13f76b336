"""The live router's subscription to its engines' KV cache events (vLLM ``--kv-events-config``).

Rule kept here: this module only carries bytes between the engines' publishers and the core's
KV index; what a message means is :mod:`narwhal.core.routing.kv_events`' decision, what the
router believes an engine holds is :class:`~narwhal.core.routing.kv_index.KvIndex`'s. A stream
that fails never charges its engine (the breaker is not told): the engine only loses its
reported entries and is placed on the router's own speculative entries, the approximate
estimate, until its stream is whole again; every such fall back is counted in ``/metrics`` and
shown per engine in ``/status`` (:meth:`KvEventSubscriber.status`).

Theory of operation: one task per engine with ``kv_events`` configured
(:class:`~narwhal.core.config.EngineEntry`) in the configuration in force holds a ZMQ SUB socket
connected to the publisher, subscribed to its topic, and a monitor of that socket. The set
follows reloads: :meth:`KvEventSubscriber.engines_changed` (called after every reload) makes
:meth:`KvEventSubscriber.run` start a task for each engine added, cancel the task of each engine
removed (its index entries go: it takes no new placement while it drains) and restart the task
of an engine whose endpoints or topic changed (its stream starts afresh). Per engine: the stream
is *up* from the socket's connection until its disconnection, and each disconnection marks the
engine down in the index (:meth:`~narwhal.core.routing.kv_index.KvIndex.stream_down`; ZMQ
reconnects by itself, and the restarted engine's new sequence starts afresh). Each message is
decoded whole or refused (counted; the index drops the engine's entries, as for a gap of unknown
size). Before a batch is applied, its sequence number is compared with the one the index
expects: when batches were missed (or, at the first batch seen, when the engine may have
published before the router connected) and the engine has a replay socket (``kv_events_replay``,
vLLM's ROUTER), a DEALER asks for every buffered batch from the first one missing (vLLM answers
each as ``["", topic, seq, payload]`` and ends with the sequence ``-1``), and those batches are
applied first, so the index sees no gap. A replay that does not answer within
``REPLAY_TIMEOUT_S`` is abandoned: the index then sees the gap and drops the engine's entries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import zmq
import zmq.asyncio
from anyio.abc import TaskGroup
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from zmq.utils.monitor import parse_monitor_message

from narwhal.core.config import EngineEntry, NarwhalConfig
from narwhal.core.routing.block_identity import VllmBlockHasher, token_id_chain
from narwhal.core.routing.kv_aware import BlockChain, kv_aware_phases
from narwhal.core.routing.kv_events import KvEventError, KvEventMessage, decode_message
from narwhal.core.routing.kv_index import KvIndex

log = logging.getLogger("narwhal.live")

REPLAY_TIMEOUT_S = 1.0
_END_SEQ = (-1).to_bytes(8, "big", signed=True)


def live_block_chain(config: NarwhalConfig) -> BlockChain | None:
    """The live router's block identity when a phase uses ``kv_aware``: the engines' hashes
    of the token ids a request carries (:mod:`narwhal.core.routing.block_identity`)."""
    if not kv_aware_phases(config.routing):
        return None
    kv = config.routing.kv_aware
    hasher = VllmBlockHasher(
        block_size=kv.block_size,
        algo=kv.hash_algo,
        seed=kv.hash_seed,
        int_hashes=kv.int_block_hashes,
    )
    return token_id_chain(hasher)


@dataclass
class StreamCounts:
    """One engine's stream, as ``/metrics`` shows it."""

    up: bool = False
    batches: int = 0
    refused: int = 0
    replays: int = 0  # replays asked for
    replayed: int = 0  # batches applied from replays
    replay_failures: int = 0
    downs: int = 0  # disconnections (each a fall back to the approximate estimate)


def _stream_spec(entry: EngineEntry) -> tuple[str | None, str | None, str]:
    """What a subscription to ``entry`` connects to (a change restarts it)."""
    return (entry.kv_events, entry.kv_events_replay, entry.kv_events_topic)


class KvEventSubscriber:
    """Feeds the index the placement reads with the KV events of every engine of the
    configuration in force (module docstring)."""

    def __init__(
        self, engines_of: Callable[[], list[EngineEntry]], index_of: Callable[[], KvIndex]
    ) -> None:
        self._engines_of = engines_of  # the configuration in force's engines (a reload changes)
        self._index_of = index_of  # the placement's index
        self.streams = {url: StreamCounts() for url in self._wanted()}
        self._following: dict[str, tuple[tuple[str | None, str | None, str], anyio.CancelScope]]
        self._following = {}
        self._changed = anyio.Event()
        self._ctx = zmq.asyncio.Context()

    def _wanted(self) -> dict[str, EngineEntry]:
        return {e.url: e for e in self._engines_of() if e.kv_events is not None}

    def engines_changed(self) -> None:
        """The configuration's engines may have changed (a reload): follow them (on the
        router's event loop)."""
        self._changed.set()

    async def run(self) -> None:
        """Follow every configured engine's stream, as reloads change them, until cancelled."""
        try:
            async with anyio.create_task_group() as group:
                while True:
                    self._reconcile(group)
                    await self._changed.wait()
                    self._changed = anyio.Event()
        finally:
            self._ctx.destroy(linger=0)

    def _reconcile(self, group: TaskGroup) -> None:
        wanted = self._wanted()
        for url, (spec, scope) in list(self._following.items()):
            entry = wanted.get(url)
            if entry is not None and _stream_spec(entry) == spec:
                continue
            scope.cancel()
            del self._following[url]
            if entry is None:  # removed: unsubscribed, its entries dropped
                self.streams.pop(url, None)
                self._index_of().forget(url)
                log.warning("KV event stream of %s unsubscribed (engine removed)", url)
            else:  # moved: the new stream starts afresh
                self.streams[url].up = False
                self._index_of().stream_down(url)
        for url, entry in wanted.items():
            if url not in self._following:
                scope = anyio.CancelScope()
                self._following[url] = (_stream_spec(entry), scope)
                self.streams.setdefault(url, StreamCounts())
                group.start_soon(self._follow_within, entry, scope)

    async def _follow_within(self, entry: EngineEntry, scope: anyio.CancelScope) -> None:
        with scope:
            await self._follow(entry)

    def status(self, url: str) -> dict[str, Any] | None:
        """``url``'s stream for ``/status`` (None: the router does not follow one for it)."""
        counts = self.streams.get(url)
        if counts is None:
            return None
        index = self._index_of()
        return {
            "connected": counts.up,
            "last_seq": index.last_seq(url),
            "gaps": index.engine_gaps(url),
            "batches": counts.batches,
            "refused": counts.refused,
            "replays": counts.replays,
            "replay_failures": counts.replay_failures,
            "downs": counts.downs,
            "placed_on_estimate": index.estimated_placements(url),
        }

    async def _follow(self, entry: EngineEntry) -> None:
        sub = self._ctx.socket(zmq.SUB)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        try:
            sub.setsockopt(zmq.SUBSCRIBE, entry.kv_events_topic.encode("utf-8"))
            sub.connect(str(entry.kv_events))
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch, entry.url, monitor)
                while True:
                    frames = await sub.recv_multipart()
                    await self._received(entry, frames)
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _watch(self, url: str, monitor: zmq.asyncio.Socket) -> None:
        counts = self.streams[url]
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_CONNECTED:
                counts.up = True
            elif event["event"] == zmq.EVENT_DISCONNECTED and counts.up:
                counts.up = False
                counts.downs += 1
                self._index_of().stream_down(url)
                log.warning("KV event stream of %s is down: approximate until it returns", url)

    async def _received(self, entry: EngineEntry, frames: list[bytes]) -> None:
        url, counts, index = entry.url, self.streams[entry.url], self._index_of()
        try:
            message = decode_message(frames)
        except KvEventError as error:
            counts.refused += 1
            index.refused(url)
            log.warning("KV event message from %s refused: %s", url, error)
            return
        expected = index.expected(url)
        missed = expected is None or message.seq > expected
        if missed and entry.kv_events_replay is not None and message.seq > 0:
            await self._replay(entry, 0 if expected is None else expected, message.seq)
        counts.batches += 1
        index.apply(url, message.seq, message.batch)

    async def _replay(self, entry: EngineEntry, start: int, before: int) -> None:
        """Apply the engine's buffered batches ``start`` .. ``before - 1`` (module docstring)."""
        url, counts = entry.url, self.streams[entry.url]
        counts.replays += 1
        dealer = self._ctx.socket(zmq.DEALER)
        got: list[KvEventMessage] = []
        try:
            dealer.connect(str(entry.kv_events_replay))
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            with anyio.fail_after(REPLAY_TIMEOUT_S):
                while True:
                    frames = await dealer.recv_multipart()
                    if len(frames) == 4 and frames[2] == _END_SEQ:
                        break
                    message = decode_message(frames[1:])
                    if start <= message.seq < before:
                        got.append(message)
        except (TimeoutError, KvEventError, zmq.ZMQError) as error:
            counts.replay_failures += 1
            log.warning(
                "KV event replay from %s failed (%s): the gap drops its entries",
                url,
                error or "no answer",
            )
            return
        finally:
            dealer.close(linger=0)
        index = self._index_of()
        for message in got:
            expected = index.expected(url)
            if expected is None or message.seq == expected:
                index.apply(url, message.seq, message.batch)
                counts.replayed += 1

    def collect(self) -> Any:
        """``/metrics`` families (a prometheus_client collector)."""
        up = GaugeMetricFamily(
            "narwhal_kv_events_stream_up",
            "1 while the engine's KV event stream is connected (0: placed on the approximate "
            "estimate)",
            labels=["engine"],
        )
        families = {
            "batches": "KV event batches applied from the live stream",
            "refused": "KV event messages that could not be decoded (the engine's entries dropped)",
            "replays": "replays asked of the engine's replay socket after a gap",
            "replayed": "KV event batches applied from replays",
            "replay_failures": "replays that failed (the gap dropped the engine's entries)",
            "downs": "KV event stream disconnections (falls back to the approximate estimate; "
            "the engine is not charged)",
        }
        counters = {
            name: CounterMetricFamily(f"narwhal_kv_events_{name}", text, labels=["engine"])
            for name, text in families.items()
        }
        for url, counts in self.streams.items():
            up.add_metric([url], float(counts.up))
            for name, family in counters.items():
                family.add_metric([url], float(getattr(counts, name)))
        yield up
        yield from counters.values()
        index = self._index_of()
        estimated = CounterMetricFamily(
            "narwhal_kv_events_placed_on_estimate",
            "placements of a prompt on the engine while its stream had delivered nothing (the "
            "approximate estimate alone)",
            labels=["engine"],
        )
        for url in self.streams:
            estimated.add_metric([url], float(index.estimated_placements(url)))
        yield estimated
        yield CounterMetricFamily(
            "narwhal_kv_index_gaps", "sequence gaps the KV index saw", value=float(index.gaps)
        )
        yield GaugeMetricFamily(
            "narwhal_kv_index_blocks", "reported blocks held in the KV index", value=index.total
        )
