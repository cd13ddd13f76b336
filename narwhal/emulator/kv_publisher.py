"""The emulated engine's KV cache event publisher, as vLLM's ``--kv-events-config`` ZMQ one.

Rule kept here: what goes on the wire is vLLM 0.32's shape, written by the core's encoder
(:func:`narwhal.core.routing.kv_events.encode_batch`): three frames (topic, 8-byte big-endian
sequence number from 0, msgpack ``[ts, events]``) on a PUB socket, and a ROUTER replay socket
answering ``["", start_seq]`` with every buffered batch from ``start_seq`` as
``["", topic, seq, payload]`` and then ``["", "", -1, ""]``. Both bind loopback by default.

Theory of operation: the prefix cache's block pool hands each event to :meth:`publish`; the
events of one cache change are sent as one batch by :meth:`flush` (the cache calls it after each
insert), so a batch is what vLLM would send after one scheduler step. Every batch is kept in a
bounded buffer for replay; a daemon thread serves the replay socket (the PUB socket is used only
from the thread that publishes). :attr:`drop_next` lets a test lose batches on purpose (their
sequence numbers are used, their bytes never sent), as a slow subscriber's high-water mark would.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import zmq

from narwhal.core.routing.kv_events import EventBatch, KvEvent, encode_batch

REPLAY_BUFFER = 10_000  # batches kept for replay (vLLM's buffer_steps default)
_END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KvEventPublisher:
    """One engine's PUB socket and replay ROUTER (module docstring)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, topic: str = "") -> None:
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self.port = self._bind(self._pub, host, port)
        self._replay = self._ctx.socket(zmq.ROUTER)
        self._replay.setsockopt(zmq.LINGER, 0)
        self.replay_port = self._bind(self._replay, host, 0)
        self.endpoint = f"tcp://{host}:{self.port}"
        self.replay_endpoint = f"tcp://{host}:{self.replay_port}"
        self._topic = topic.encode("utf-8")
        self._pending: list[KvEvent] = []
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BUFFER)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.drop_next = 0  # batches to lose on purpose (tests)
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    @staticmethod
    def _bind(sock: zmq.Socket[bytes], host: str, port: int) -> int:
        if port:
            sock.bind(f"tcp://{host}:{port}")
            return port
        return sock.bind_to_random_port(f"tcp://{host}")

    def publish(self, event: KvEvent) -> None:
        """One event of the cache change in progress (sent by :meth:`flush`)."""
        self._pending.append(event)

    def flush(self) -> None:
        """Send the pending events as one batch (nothing when there are none)."""
        if not self._pending or self._closed.is_set():
            self._pending.clear()
            return
        payload = encode_batch(EventBatch(time.time(), tuple(self._pending)))
        self._pending.clear()
        seq = self._seq
        self._seq += 1
        with self._lock:
            self._buffer.append((seq, payload))
        if self.drop_next > 0:
            self.drop_next -= 1
            return
        self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])

    def _serve_replay(self) -> None:
        poller = zmq.Poller()
        poller.register(self._replay, zmq.POLLIN)
        while not self._closed.is_set():
            if not poller.poll(50):
                continue
            frames = self._replay.recv_multipart()
            if len(frames) != 3:
                continue  # not a replay request (vLLM ignores it too)
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            with self._lock:
                kept = [(seq, payload) for seq, payload in self._buffer if seq >= start]
            for seq, payload in kept:
                self._replay.send_multipart(
                    [client, b"", self._topic, seq.to_bytes(8, "big"), payload]
                )
            self._replay.send_multipart([client, b"", b"", _END_SEQ, b""])

    def close(self) -> None:
        """Stop the replay thread and close both sockets."""
        self._closed.set()
        self._thread.join(timeout=2)
        self._pub.close(linger=0)
        self._replay.close(linger=0)
        self._ctx.term()
