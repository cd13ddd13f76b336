"""Fleet changes: what a configuration reload changes in a running router, decided once.

Rule kept here: a reload is applied whole or not at all. A new configuration that changes a
key a running router cannot take is refused, naming each such key, and the router keeps the
configuration it has; so is one that does not validate (the driver reads and parses the file;
:meth:`FleetChanges.invalid` records why it could not). Nothing here does I/O or reads a clock.

Theory of operation:
- Reloadable: ``[[engines]]`` (engines added and removed; a kept engine's ``kv_endpoint``),
  ``[engine]`` (timeouts) and ``[client]``, which apply to requests that arrive after the
  reload (a request reads them once, when it starts). Not reloadable: ``[recovery]``,
  ``[routing]``, ``[admission]``, ``[engine_contract]`` and the role of a listed engine; the
  policy objects built from them hold state a change would invalidate (streaks counted against
  one ``eject_after``, a routing policy's index, admission slots held). :func:`refusals` lists
  what a new configuration changes of those.
- An added engine is JOINING (:mod:`narwhal.core.breaker`): listed for placement but held out
  until its first probe passes (the same inference probe readmission uses, run by the
  maintenance loop at once). A removed engine is DRAINING: off the placement lists at once,
  while the streams it holds finish; :meth:`FleetChanges.settle` forgets it once it holds no
  reservation and no probe of it is in flight. An engine listed again while it drains stays,
  its health state kept. An engine in both configurations keeps its breaker state (streaks,
  ejection, quarantine, epoch).
- Every reload is one ``reload`` decision (``result``: applied, unchanged, refused, invalid),
  plus ``join_start``, ``drain``, ``drain_cancelled`` and ``forget`` decisions per engine, and
  ``join`` when a joining engine's probe passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from narwhal.core.breaker import Breaker
from narwhal.core.config import NarwhalConfig, Role
from narwhal.core.placement import Placement
from narwhal.core.records import DecisionLog

RELOADABLE_SECTIONS = ("engines", "engine", "client")
FIXED_SECTIONS = ("recovery", "routing", "admission", "flow", "engine_contract", "tracing")
"""Sections a reload may not change (a restart takes them)."""


@dataclass(frozen=True)
class Reload:
    """What one reload did. ``result``: applied | unchanged | refused | invalid."""

    result: str
    added: tuple[str, ...] = ()  # now joining
    removed: tuple[str, ...] = ()  # now draining (or forgotten at once: they held nothing)
    kept: tuple[str, ...] = ()  # draining engines listed again: they stay
    changed: tuple[str, ...] = ()  # other keys whose values changed (dotted paths)
    forgotten: tuple[str, ...] = ()  # draining engines dropped (they held nothing)
    problems: tuple[str, ...] = ()  # why it was refused or invalid

    @property
    def applied(self) -> bool:
        return self.result == "applied"

    def summary(self) -> str:
        """One line for the operator."""
        if self.problems:
            return f"{self.result}, keeping the previous configuration: " + "; ".join(self.problems)
        if not self.applied:
            return self.result
        parts = [
            f"{label} {', '.join(urls)}"
            for label, urls in (
                ("joining", self.added),
                ("draining", tuple(url for url in self.removed if url not in self.forgotten)),
                ("removed (it held nothing)", self.forgotten),
                ("kept (no longer draining)", self.kept),
                ("changed", self.changed),
            )
            if urls
        ]
        return "applied: " + ("; ".join(parts) or "no change to the fleet")


def _leaves(value: Any, path: str) -> dict[str, Any]:
    """A dumped configuration as dotted key paths -> leaf values."""
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, item in value.items():
            found.update(_leaves(item, f"{path}.{key}" if path else str(key)))
        return found
    return {path: value}


def changed_keys(old: NarwhalConfig, new: NarwhalConfig, section: str) -> list[str]:
    """The dotted keys of ``section`` whose values differ (the section itself when one side
    has none, as ``engine_contract`` may)."""
    before, after = getattr(old, section), getattr(new, section)
    if before == after:
        return []
    if before is None or after is None:
        return [section]
    a = _leaves(before.model_dump(mode="json"), section)
    b = _leaves(after.model_dump(mode="json"), section)
    return sorted(key for key in a.keys() | b.keys() if a.get(key) != b.get(key))


def refusals(new: NarwhalConfig, old: NarwhalConfig, known: dict[str, Role]) -> list[str]:
    """Why ``new`` cannot replace ``old`` in a running router (empty: it can). ``known``: the
    role of every engine the router holds, draining ones included."""
    problems = [
        f"{key}: not reloadable (restart the router to change it)"
        for section in FIXED_SECTIONS
        for key in changed_keys(old, new, section)
    ]
    for index, entry in enumerate(new.engines):
        role = known.get(entry.url)
        if role is not None and role is not entry.role:
            problems.append(
                f"engines[{index}].role: {entry.url} is a {role.value!r} engine; a role does "
                "not change on reload (remove the engine, reload, then add it back)"
            )
    return problems


class FleetChanges:
    """Applies reloads to the breaker and placement of one router and finishes drains."""

    def __init__(self, breaker: Breaker, placement: Placement, log: DecisionLog) -> None:
        self._breaker = breaker
        self._placement = placement
        self._log = log
        self.draining: dict[str, Role] = {}  # removed engines still holding something

    def apply(self, old: NarwhalConfig, new: NarwhalConfig, now: float) -> Reload:
        """Move the fleet from ``old`` to ``new`` (or refuse, changing nothing)."""
        if new == old:
            return self._record(Reload("unchanged"), now)
        current = {entry.url: entry.role for entry in old.engines}
        problems = refusals(new, old, {**self.draining, **current})
        if problems:
            return self._record(Reload("refused", problems=tuple(problems)), now)
        roles = {entry.url: entry.role for entry in new.engines}
        added = [url for url in roles if url not in current and url not in self.draining]
        kept = [url for url in roles if url in self.draining]
        removed = [url for url in current if url not in roles]
        breaker = self._breaker
        for url in added:
            breaker.add_joining(url, roles[url], now)
        for url in kept:
            del self.draining[url]
            breaker.cancel_drain(url, now)
        for url in removed:
            self.draining[url] = current[url]
            breaker.start_drain(url, now)
        self._placement.serve(roles)
        changed = [
            key for section in ("engine", "client") for key in changed_keys(old, new, section)
        ]
        endpoints = {entry.url: entry.kv_endpoint for entry in old.engines}
        changed += [
            f"kv_endpoint of {entry.url}"
            for entry in new.engines
            if entry.url in endpoints and endpoints[entry.url] != entry.kv_endpoint
        ]
        outcome = Reload(
            "applied",
            added=tuple(added),
            removed=tuple(removed),
            kept=tuple(kept),
            changed=tuple(changed),
            forgotten=tuple(self.settle(now)),
        )
        return self._record(outcome, now)

    def invalid(self, reason: str, now: float) -> Reload:
        """The new configuration could not be read or validated: nothing changes."""
        return self._record(Reload("invalid", problems=(reason,)), now)

    def settle(self, now: float) -> list[str]:
        """Forget the draining engines that hold nothing now (no reservation, no probe)."""
        placement, breaker = self._placement, self._breaker
        done = [
            url
            for url in self.draining
            if placement.held(url) == 0 and not breaker.health(url).probing
        ]
        for url in done:
            del self.draining[url]
            breaker.forget(url)
            placement.forget(url)
            self._log.add(now, "forget", url)
        return done

    def _record(self, outcome: Reload, now: float) -> Reload:
        self._log.add(
            now,
            "reload",
            None,
            result=outcome.result,
            added=len(outcome.added),
            removed=len(outcome.removed),
            problems=" | ".join(outcome.problems),
        )
        return outcome
