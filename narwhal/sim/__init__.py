"""The simulator: a SimPy fleet of vLLM-like GPU engines with injected faults, driven by the very
core (lifecycle, breaker, probes, retries, placement, timeouts) the live router runs.
See docs/simulator.md; the entry point is ``narwhal simulate`` (:mod:`narwhal.sim.commands`)."""
