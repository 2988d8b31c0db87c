"""Integer helpers every layer shares; a leaf module (no kvsim imports, no third-party ones)."""


def ceil_div(a: int, b: int) -> int:
    """`cdiv` as vLLM spells it (vllm/utils: cdiv): the number of size-`b` pieces that hold `a`."""
    return -(-a // b)
