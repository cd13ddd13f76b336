"""The simulated GPU engine: a vLLM engine as SimPy events, split by concern as vLLM splits its
own (``vllm/v1``: ``request.py``, ``core/sched/scheduler.py``, ``core/kv_cache_manager.py``).

- :mod:`~narwhal.sim.gpu.engine`: :class:`SimEngine`, the HTTP surface and the chain of step
  events that ties the rest together;
- :mod:`~narwhal.sim.gpu.scheduler`: step planning, chunked prefill, the sequence cap,
  preemption, block growth;
- :mod:`~narwhal.sim.gpu.blocks`: the KV block manager (admission, growth) over the shared
  block pool and prefix cache, :mod:`narwhal.engines.block_pool`;
- :mod:`~narwhal.sim.gpu.sequence`: a request's state inside the engine, and its stream;
- :mod:`~narwhal.sim.gpu.handoffs`: a producer's KV leases and a consumer's KV pulls;
- :mod:`~narwhal.sim.gpu.output`: tokens written to streams, and when the router is woken;
- :mod:`~narwhal.sim.gpu.switches`: the fault switches and the per-request fault draws;
- :mod:`~narwhal.sim.gpu.wire`: the simulator's tokenizer and filler text (the bytes are
  :mod:`narwhal.core.wire`'s);
- :mod:`~narwhal.sim.gpu.params` and :mod:`~narwhal.sim.gpu.totals`: what an engine is, and
  what it did.
"""
