"""An engine emulator that speaks vLLM 0.32's HTTP protocol, with scripted faults.

A peer of the simulated engine (:mod:`narwhal.sim`): both are engines the router can be run
against, one in real time over HTTP, one in simulated time; both act out the faults of
:mod:`narwhal.core.injected_faults`. :mod:`.app` routes the paths; :mod:`.inference` serves
completions (parsed by :mod:`.request`), :mod:`.handoff` the KV handoff (blocks held by
:mod:`.kv`), :mod:`.surfaces` ``/v1/models`` and ``/metrics``, :mod:`.admin` the fault API;
:mod:`.faults` parses fault scripts and :mod:`.acting` acts them out. :mod:`.text` makes the
deterministic text, :mod:`.timing` the pluggable timing model; :mod:`.runner` binds and builds
a server, :mod:`.commands` is ``narwhal emulate``.
"""
