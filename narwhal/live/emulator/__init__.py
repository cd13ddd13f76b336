"""An engine emulator that speaks vLLM's HTTP protocol (docs/contract.md), with faults.

See :mod:`narwhal.live.emulator.app` for the server, :mod:`.faults` for the fault scripts,
:mod:`.kv` for the KV blocks a consumer really pulls from a producer, :mod:`.text` for the
deterministic generated text and :mod:`.timing` for the pluggable engine timing model.
"""
