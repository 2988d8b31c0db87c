"""kvsim: a discrete-event capacity simulator for LLM serving with a paged KV cache.

`import kvsim` stays light: no torch, triton or matplotlib (and no simpy until a
simulation runs). Heavier entry points are loaded on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"
