"""Holding the simulated engine against real vLLM runs.

``runlog`` reads a real run (LLMServingSim's ``bench/examples`` layout), ``replay`` simulates
it on the simulated engine, ``compare`` measures the difference, ``report`` writes and prints it.
"""
