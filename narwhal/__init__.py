"""Narwhal: a router for disaggregated (prefill/decode) LLM serving, and a fleet simulator.

The version below is the distribution's (``narwhal-router``): pyproject.toml reads it from here,
so ``narwhal --version`` and the package metadata cannot disagree.
"""

__version__ = "0.1.0"
