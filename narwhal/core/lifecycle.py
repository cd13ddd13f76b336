"""The request lifecycle: prefill -> validate -> decode -> stream -> retry / cleanup.

Rule kept here: this is the only implementation of a request's life, for the live router and
the simulator alike. It awaits nothing but port calls, passes every deadline to the port, and
releases what it holds in ``finally`` with synchronous calls, so a cancelled or abandoned
request (client gone) leaves no reservation, budget or handoff behind.

Theory of operation (one attempt):
1. Place a producer; reserve a prefill slot. Send the one-token, non-streaming prefill leg,
   bounded by the request deadline and by ``engine.max_handoff_age_s`` (the handoff age starts
   when this leg starts). ``ttft_s`` is taken when it completes.
2. Validate the descriptor (engine identity, block ids, connector, pinned side channel).
3. Place a consumer; reserve a decode slot; refuse a handoff that has grown too old. Open the
   decode stream: ``engine.first_token_timeout_s`` runs from before the open until the first
   generated token; after it, ``engine.decode_read_timeout_s`` bounds silence between chunks
   (0: the request deadline does).
4. The first generated token is the commit point: the client gets HTTP 200 then (metadata that
   came before it is flushed right behind the headers). Before it, every fault is an ordinary
   HTTP error and may be retried; after it, a fault ends the stream with one terminal
   ``data: {"error": ...}`` event. What one read of the decode stream carries goes to the client
   in one write, the final ``[DONE]`` included (after the consumer is credited with success).
   With ``recovery.resume_streams``, a fault after commit may instead resume the same client
   stream on a fresh attempt from the delivered token ids, or end it cleanly when every token
   was delivered and only the end was lost (:mod:`narwhal.core.resume` decides).
Per-request disaggregation (:mod:`narwhal.core.routing.disagg`) may skip steps 1-2: a short
uncached prompt, or no placeable producer with ``no_producer = "local"``, goes straight to a
consumer that computes the prompt itself (the contract's same-worker path). With
``[routing] prefill_fallback = "local"``, a request whose producer attempts all failed (no retry
left, :func:`narwhal.core.retry.falls_back_locally`; or a retry found no producer placeable) gets
one such attempt too: the producers stay charged for their faults, the consumer only for its own
leg, and the record says ``prefill_fallback``.
A request naming a model the pinned contract does not serve is answered 404 before step 1
(:mod:`narwhal.core.served_model`): no attempt, no engine asked.
Faults are charged to the engine that caused them (breaker streak, quarantine); a transient fault
before commit starts a fresh attempt (new ids, new placement, new producer ownership) when
attempts, the deadline and the retry budget allow; otherwise the client gets the fault's status.
A fresh attempt avoids every engine an earlier attempt failed on, an uncharged empty stream
(``[DONE]`` before any token) included; that empty stream is charged to its consumer once another
engine sends the request a token (:mod:`narwhal.core.empty_streams`).

The client is charged for what the client does. Every write to it goes through
:class:`~narwhal.core.client_writes.ClientWrites`, bounded by
``min(request deadline, start of the write + client.write_timeout_s)``: a client that leaves a
write blocked past that is cut off (decision ``client_cut``; outcome ``client_too_slow``, or
``deadline`` when the request deadline came first) and the request ends there, releasing
everything, with no engine charged. Time spent writing is not engine silence: after a write that
took any time, silence is measured from its end (``DecodeLeg.resumed``; decision
``client_blocked`` when the write outlasted the silence deadline).
"""

from __future__ import annotations

from typing import Any

from narwhal.core import wire
from narwhal.core.assemble import ResponseAssembler
from narwhal.core.client_writes import (
    CLIENT_GONE_STATUS,
    ClientCut,
    ClientWrites,
    terminal_event,
)
from narwhal.core.empty_streams import EmptyStreams
from narwhal.core.errors import Fault, FaultKind, fault
from narwhal.core.legs import DecodeLeg, prefill_leg, prompt_tokens_of, stale_handoff
from narwhal.core.placement import Reservation
from narwhal.core.policies import Policies
from narwhal.core.ports import ClientGone, ClientSink, Ports
from narwhal.core.records import RequestRecord
from narwhal.core.requests import ClientRequest, decode_body
from narwhal.core.resume import END, RESUME, StreamResume, forwarded, relayed, resumable
from narwhal.core.retry import Deadline, falls_back_locally
from narwhal.core.routing.disagg import NO_PRODUCER, PRODUCER_FAILED, SHORT_PROMPT
from narwhal.core.served_model import unserved_model
from narwhal.core.sse import EventKind, SseEvent


def _status_headers(failure: Fault, retry_after_s: float) -> dict[str, str]:
    if failure.kind is FaultKind.NO_ENGINE:
        return {"retry-after": str(max(1, round(retry_after_s)))}
    return {}


class _Lifecycle:
    def __init__(
        self, request: ClientRequest, ports: Ports, policies: Policies, sink: ClientSink
    ) -> None:
        self.request = request
        self.ports = ports
        self.policies = policies
        self.sink = sink
        cfg = policies.config
        self.engine_cfg = cfg.engine
        self.deadline = Deadline(request.arrival + cfg.engine.request_timeout_s)
        self.client = ClientWrites(sink, ports.clock, self.deadline, cfg.client.write_timeout_s)
        self.recovery = cfg.recovery
        # a streaming request's resume state (None: resuming is off or the client does not stream)
        self.resume: StreamResume | None = resumable(
            request, cfg.recovery.resume_streams, cfg.recovery.resume_max_seq_len
        )
        self.leg_request = request  # what the attempt's legs serve (a resumed leg: its own)
        self.held: list[Reservation] = []
        self.failed_engines: set[str] = set()  # avoided by later attempts (Envoy's previous_hosts)
        self.empty_streams = EmptyStreams(request.request_id)
        self.engines: list[str] = []
        self.attempts = 0
        self.producer_failed = False  # an attempt failed on its producer (charged to it)
        self.fell_back = False  # the consumer prefills, every producer attempt having failed
        self.committed = False
        self.got_token = False
        self.tokens = 0
        self.prompt_tokens: int | None = None  # as the last engine to report it said
        self.ttft_s: float | None = None
        self.first_byte_s: float | None = None
        self.shortest_attempt_s: float | None = None  # a retry must have at least this left
        self.decode_leg: DecodeLeg | None = None  # the attempt's decode stream, if opened
        self.unused_handoff: tuple[str, dict[str, Any]] | None = None
        self.final: tuple[int, str, str | None] | None = None  # status, outcome, error
        self.record: RequestRecord | None = None  # written once, on every path

    # ------------------------------------------------------------------ the request

    async def run(self) -> RequestRecord:
        budget = self.policies.budget
        budget.request_started()
        holding_retry = False
        try:
            unserved = unserved_model(self.request.body, self.policies.config)
            if unserved is not None:  # answered for the fleet: no placement, nobody charged
                await self._fail(unserved)
                return self._finish_record()
            while True:
                self.attempts += 1
                started = self.ports.clock.now()
                failure = await self._attempt()
                self._cleanup_attempt()
                if holding_retry:
                    budget.release()
                    holding_retry = False
                if failure is None:
                    return self._finish_record()
                now = self.ports.clock.now()
                self._charge(failure, now)
                took = now - started
                if self.shortest_attempt_s is None or took < self.shortest_attempt_s:
                    self.shortest_attempt_s = took
                if self._may_retry(failure, now) and budget.try_acquire():
                    holding_retry = True
                    self.policies.log.add(
                        now,
                        "retry",
                        failure.engine,
                        request=self.request.request_id,
                        fault=failure.kind.value,
                    )
                    continue
                resume = self.resume
                if self.committed and resume is not None:
                    step = resume.after_failure(
                        failure, now, self.deadline, self.recovery, budget, self.policies.log
                    )
                    if step == END:  # every token was sent: only the end lost
                        self.final = (200, "ok", None)
                        await self.client.end(resume.ending(), now)
                        return self._finish_record()
                    if step == RESUME:
                        holding_retry = True
                        continue
                if self._falls_back(failure, now):
                    continue
                await self._fail(failure)
                return self._finish_record()
        except ClientGone:
            self.final = (CLIENT_GONE_STATUS, "client_gone", "client disconnected")
            return self._finish_record()
        except ClientCut as cut:
            self._client_cut(cut.deadline)
            return self._finish_record()
        finally:
            self._cleanup_attempt()
            if holding_retry:
                budget.release()
            budget.request_finished()
            if self.record is None:
                # cancelled by the driver (the client went away), or the last write to the
                # client failed: it did not get its answer, whatever that would have been
                self.final = (CLIENT_GONE_STATUS, "client_gone", "request cancelled")
                self._finish_record()

    def _may_retry(self, failure: Fault, now: float) -> bool:
        return (
            failure.retryable
            and not self.committed  # nothing visible yet (a non-streaming client sees the end)
            and self.attempts < self.policies.config.recovery.max_attempts
            and self.deadline.permits_attempt(now, self.shortest_attempt_s or 0.0)
        )

    def _falls_back(self, failure: Fault, now: float) -> bool:
        """Whether the next attempt is the consumer's own prefill after ``failure`` ended the
        last producer attempt this request may make (``[routing] prefill_fallback``)."""
        if not falls_back_locally(
            failure,
            enabled=self.policies.placement.disaggregation.local_after_producer_failure,
            committed=self.committed,
            fell_back=self.fell_back,
            producer=self._producer,
            now=now,
            deadline=self.deadline,
        ):
            return False
        self.fell_back = True
        return True

    def _charge(self, failure: Fault, now: float) -> None:
        if failure.engine is None:
            return
        if failure.engine == self._producer and failure.phase == "prefill":
            self.producer_failed = True
        self.failed_engines.add(failure.engine)
        epoch = self._epochs.get(failure.engine)
        if epoch is None:
            epoch = self.policies.breaker.epoch(failure.engine)
        producer = self._producer if failure.engine != self._producer else None
        self.policies.breaker.on_failure(
            failure.engine, epoch, now, phase=failure.phase, producer=producer
        )

    async def _fail(self, failure: Fault) -> None:
        now = self.ports.clock.now()
        self.final = (failure.status, failure.kind.value, failure.message)
        self.policies.log.add(
            now,
            "status",
            None,
            request=self.request.request_id,
            status=failure.status,
            committed=self.committed,
        )
        if self.committed:
            await self.client.end(terminal_event(failure), now)
        else:
            headers = _status_headers(failure, self.policies.config.recovery.probe_interval_s)
            await self.client.respond(failure.status, failure.error_body(), headers)

    # ------------------------------------------------------------------ the client

    def _client_cut(self, until: float) -> None:
        """A write was still blocked at ``until``: the client's fault, no engine's."""
        client = self.client
        self.policies.log.add(
            self.ports.clock.now(),
            "client_cut",
            None,
            request=self.request.request_id,
            reason=client.cut_reason(until),
        )
        if self.final is not None and self.final[0] != 200:
            return  # a failure stays the failure; the client just did not read its end
        self.final = client.cut_final(until)

    def _finish_record(self) -> RequestRecord:
        """Hand the request's one record to ``policies.on_record``."""
        assert self.final is not None and self.record is None
        status, outcome, error = self.final
        now = self.ports.clock.now()
        record = RequestRecord(
            request_id=self.request.request_id,
            arrival=self.request.arrival,
            status=status,
            outcome=outcome,
            committed=self.committed,
            ttft_s=self.ttft_s,
            first_byte_s=self.first_byte_s,
            finished_s=now - self.request.arrival,
            attempts=self.attempts,
            engines=tuple(self.engines),
            output_tokens=self.tokens,
            error=error,
            prompt_tokens=self.prompt_tokens,
            prefill_fallback=self.fell_back,
            resumes=0 if self.resume is None else self.resume.resumes,
            resume_refused=None if self.resume is None else self.resume.refused,
        )
        self.record = record
        self.policies.on_record(record)
        return record

    def _cleanup_attempt(self) -> None:
        for reservation in self.held:
            reservation.release()
        self.held.clear()
        if self.decode_leg is not None:
            leg, self.decode_leg = self.decode_leg, None
            leg.close()
        if self.unused_handoff is not None:
            producer, descriptor = self.unused_handoff
            self.unused_handoff = None
            self.ports.transport.release_handoff(producer, descriptor)

    # ------------------------------------------------------------------ one attempt

    _producer: str | None = None
    _epochs: dict[str, int]

    def _reserve(self, url: str, phase: str, now: float) -> Reservation:
        reservation = self.policies.placement.reserve(url, phase, now, self.request.request_id)
        self.held.append(reservation)
        self._epochs[url] = reservation.epoch
        self.engines.append(url)
        return reservation

    def _no_engine(self, phase: str) -> Fault:
        role = "prefill" if phase == "prefill" else "decode"
        return fault(
            FaultKind.NO_ENGINE,
            f"no {role} engine is available (all ejected, probing or quarantined)",
            engine=None,
            phase="placement",
        )

    async def _attempt(self) -> Fault | None:
        clock, policies = self.ports.clock, self.policies
        self._epochs = {}
        self._producer = None
        if self.resume is not None:
            if not self.committed:  # a fresh attempt before anything was shown
                self.resume.restarted()
            self.leg_request = self.resume.leg_request()
        request = self.leg_request
        now = clock.now()
        if self.deadline.expired(now):
            return fault(
                FaultKind.DEADLINE, "request deadline passed", engine=None, phase="request"
            )
        if not policies.placement.any_eligible("decode", now):
            return self._no_engine("decode")  # nobody could take the handoff: spare the prefill
        placement = policies.placement
        if self.fell_back:
            return await self._prefill_on_consumer(now, PRODUCER_FAILED)
        if placement.prefill_locally(request, now, self.failed_engines):
            return await self._prefill_on_consumer(now, SHORT_PROMPT)
        producer = placement.choose("prefill", now, self.failed_engines, request)
        if producer is None:
            if placement.local_without_producer:
                return await self._prefill_on_consumer(now, NO_PRODUCER)
            if self.producer_failed and placement.disaggregation.local_after_producer_failure:
                self.fell_back = True  # a retry after a producer fault found no producer
                return await self._prefill_on_consumer(now, PRODUCER_FAILED)
            return self._no_engine("prefill")
        placement.prefill_routes.remote += 1
        self._producer = producer
        prefill_slot = self._reserve(producer, "prefill", now)
        prefilled = await prefill_leg(
            self.ports.transport,
            clock,
            producer,
            request,
            backend_request_id=policies.new_id(f"{self.request.request_id}-p{self.attempts}"),
            connector=policies.kv_connector,
            pinned_side_channel=policies.pinned_side_channel(producer),
            deadline=self.deadline.at,
            max_handoff_age_s=self.engine_cfg.max_handoff_age_s,
        )
        prefill_slot.release()
        if prefilled.replied_at is not None and not self.committed:  # the producer replied
            self.ttft_s = prefilled.replied_at - self.request.arrival
            if prefilled.prompt_tokens is not None:
                self.prompt_tokens = prefilled.prompt_tokens
        if prefilled.fault is not None:
            return prefilled.fault
        descriptor = prefilled.descriptor
        assert descriptor is not None
        now = clock.now()
        policies.breaker.on_success(producer, self._epochs[producer], now, phase="prefill")
        self.unused_handoff = (producer, descriptor)

        consumer = policies.placement.choose("decode", now, self.failed_engines, request)
        if consumer is None:
            return self._no_engine("decode")
        self._reserve(consumer, "decode", now)
        too_old = stale_handoff(prefilled.started_at, now, self.engine_cfg.max_handoff_age_s)
        if too_old is not None:
            return too_old
        crossed = consumer != producer
        body = decode_body(request, descriptor if crossed else None)
        return await self._decode(
            consumer,
            body,
            policies.new_id(f"{self.request.request_id}-d{self.attempts}"),
            pulls=crossed,
        )

    async def _prefill_on_consumer(self, now: float, reason: str) -> Fault | None:
        """The contract's same-worker path for a request disaggregation keeps whole
        (:mod:`narwhal.core.routing.disagg`): the consumer computes the prompt itself, its
        decode leg carrying no transfer parameters; no producer leg, so no ``ttft_s``."""
        policies = self.policies
        request = self.leg_request
        consumer = policies.placement.choose("decode", now, self.failed_engines, request)
        if consumer is None:
            return self._no_engine("decode")
        policies.placement.prefill_routes.count_local(reason)
        if policies.log.enabled:
            policies.log.add(
                now, "prefill_local", consumer, request=self.request.request_id, reason=reason
            )
        self._reserve(consumer, "decode", now)
        return await self._decode(
            consumer,
            decode_body(request, None),
            policies.new_id(f"{self.request.request_id}-d{self.attempts}"),
            pulls=False,
        )

    # ------------------------------------------------------------------ decode and stream

    async def _decode(
        self, consumer: str, body: dict[str, Any], decode_id: str, *, pulls: bool
    ) -> Fault | None:
        """Stream the decode leg to the client; ``pulls``: the consumer pulls the handoff."""
        cfg = self.engine_cfg
        leg = self.decode_leg = DecodeLeg(
            self.ports.transport,
            self.ports.clock,
            consumer,
            first_token_timeout_s=cfg.first_token_timeout_s,
            decode_read_timeout_s=cfg.decode_read_timeout_s,
            request_deadline=self.deadline.at,
        )
        # (a resumed leg's own endpoint: a chat stream goes on as a completions request)
        failure = await leg.open(self.leg_request.endpoint, body, {"X-Request-Id": decode_id})
        if pulls and leg.delivered:
            # The consumer has the descriptor and owns the pull from here on. A refused
            # connection never delivered it: the handoff stays unused and is released.
            self.unused_handoff = None
        if failure is not None:
            return failure
        pending_metadata: list[bytes] = []
        assembler = (
            None
            if self.request.stream
            else ResponseAssembler(self.request.endpoint, cfg.max_response_bytes)
        )
        if not self.committed:  # an earlier attempt's tokens were never shown: count afresh
            self.got_token, self.tokens, self.first_byte_s = False, 0, None
        clock, transport, policies = self.ports.clock, self.ports.transport, self.policies
        resume = self.resume
        relay_asked = False  # whether the transport was asked to relay this stream's reads
        while True:
            result = await transport.next_chunk(leg.handle, leg.deadline)
            now = clock.now()
            out: list[bytes] = []  # what this read forwards, sent in one write
            read = leg.read(result, now)
            times = read.times
            for i, event in enumerate(read.events):
                at = times[i]
                kind = event.kind
                if resume is not None and kind is not EventKind.DONE:
                    resume.saw(event)
                if kind is EventKind.TOKEN:
                    if not self.got_token:
                        self.got_token = True
                        self.empty_streams.answered(consumer, at, policies.breaker, policies.log)
                        self.first_byte_s = at - self.request.arrival
                        if assembler is None:
                            await self.client.commit(now)
                            self.committed = True
                            out += pending_metadata
                    self.tokens += 1
                    if assembler is None:
                        out.append(forwarded(resume, event))
                    elif not assembler.take(event):
                        return assembler.too_large(consumer)
                elif kind is EventKind.METADATA:
                    self._metadata(event)
                    if self.committed:
                        out.append(forwarded(resume, event))
                    elif assembler is None:
                        pending_metadata.append(forwarded(resume, event))
                    elif not assembler.take(event):
                        return assembler.too_large(consumer)
                else:  # DONE after at least one token: the reader returns nothing after it
                    if assembler is None:
                        out.append(event.wire())  # the read's last events and [DONE]: one write
                    await self._succeed(consumer, at, out, assembler)
                    return None
            if out:
                await self.client.send(b"".join(out), now)
                back_at = clock.now()
                if back_at > now and leg.resumed(back_at):  # the write took time: not silence
                    self.policies.log.add(
                        back_at,
                        "client_blocked",
                        None,
                        request=self.request.request_id,
                        blocked_s=back_at - now,
                    )
            if leg.fault is not None:
                if leg.fault.kind is FaultKind.DONE_BEFORE_TOKEN and self.committed:
                    # a resumed leg that ends at once: the sequence ended where the last stopped
                    await self._succeed(consumer, clock.now(), [wire.DONE], None)
                    return None
                if leg.fault.kind is FaultKind.DONE_BEFORE_TOKEN:  # not charged (yet): avoided
                    self.failed_engines.add(consumer)
                    self.empty_streams.ended_empty(consumer, self._epochs[consumer], self._producer)
                return leg.fault
            if not relay_asked and self.committed and assembler is None:
                relay_asked = True  # (a transport that cannot relay reads on through the loop)
                transport.relay_reads(leg.handle, self._relay)

    def _metadata(self, event: SseEvent) -> None:
        """A metadata event's usage, if it has one: the decode's own prompt count."""
        if self.resume is not None and not self.resume.first_leg:
            return  # a resumed leg counts the delivered tokens as prompt: not the client's
        if event.payload is not None and "usage" in event.payload:
            reported = prompt_tokens_of(event.payload)
            if reported is not None:
                self.prompt_tokens = reported

    def _relay(self, data: bytes, at: float) -> float | None:
        """One read taken where it arrived (:meth:`Transport.relay_reads`), without waking the
        decode loop: a committed stream's read of whole token and metadata events that the
        client takes at once, with the loop's bookkeeping for them; the deadline of the next
        read. Any other read (None) is the loop's, and it sees the same bytes."""
        leg = self.decode_leg
        if leg is None:
            return None
        events = leg.forwardable(data)
        if events is None:
            return None
        resume = self.resume
        out = relayed(resume, events)  # None: a resumed leg's events, rewritten in the loop
        if out is None or not self.sink.send_now(out):
            return None
        for event in events:
            if resume is not None:
                resume.saw(event)
            if event.kind is EventKind.TOKEN:
                self.tokens += 1
            else:
                self._metadata(event)
        leg.forwarded(at)
        return leg.deadline

    async def _succeed(
        self, consumer: str, now: float, out: list[bytes], assembler: ResponseAssembler | None
    ) -> None:
        """The stream reached ``[DONE]``: credit the consumer, then send ``out`` (a stream's
        last events, ``[DONE]`` included) or the assembled response."""
        self.policies.breaker.on_success(consumer, self._epochs[consumer], now, phase="decode")
        self.final = (200, "ok", None)
        if self.policies.log.enabled:
            self.policies.log.add(
                now,
                "status",
                None,
                request=self.request.request_id,
                status=200,
                committed=self.committed,
            )
        if assembler is None:
            await self.client.end(b"".join(out), self.ports.clock.now())
        else:
            await self.client.respond(200, assembler.result(), {})


async def serve_request(
    request: ClientRequest, ports: Ports, policies: Policies, sink: ClientSink
) -> RequestRecord:
    """Serve one client request to its end; the record is also passed to ``policies.on_record``."""
    return await _Lifecycle(request, ports, policies, sink).run()
