"""Measured runs (vLLM) and the comparison of kvsim against them."""
