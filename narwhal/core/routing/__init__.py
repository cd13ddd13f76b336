"""Routing policies: which of the eligible engines serves a phase of a request.

Rule kept here: a policy only ranks the candidates :class:`~narwhal.core.placement.Placement`
gives it (engines of the phase's role the breaker lets take traffic, less those the request
failed on while others exist); eligibility, the quarantine fallback, the ejection cap and the
retry's "avoid" rule stay in placement and so apply to every policy alike.

Modules: :mod:`.policy` (the interface and the reservation-based rules), :mod:`.load`
(engine-reported load and ``least_loaded``), :mod:`.vllm_metrics` (vLLM's ``/metrics`` text
read as a load), :mod:`.prefix` (the prompt block index and ``prefix_affinity``), :mod:`.build`
(a policy from its configured name), :mod:`.disagg` (per-request disaggregation: whether a
prompt is prefilled on a producer or by its consumer), :mod:`.kv_events`, :mod:`.kv_index`,
:mod:`.block_identity` and :mod:`.kv_aware` (the engines' own KV events and the policy that
reads them), :mod:`.prompt_tokens` (text and chat prompts' token ids from an engine, opt-in).
"""
