"""Which beams survive a beam-search step: real beam search over drawn next-token distributions.

Beam search keeps the `W` highest-scoring continuations (cumulative log-probability) out of
every beam's candidates (vLLM v0's beam search: the top `2·W` candidates of the group, the
best `W` unfinished ones kept), so a beam whose next token is uncertain can fill several
slots with its alternatives while the weakest beams die, and the survivors share long
prefixes. kvsim has no model weights, so each beam's next-token distribution is drawn:

    beam i's next-token distribution   p_i ~ Dirichlet(ALPHA, ..., ALPHA) over VOCAB tokens, independently
    candidate score                    beam score + log p_i(token)
    survivors                          the W best of the W · VOCAB candidates

A small ALPHA makes almost every draw nearly one-hot (the LM is sure of its next token, each
beam keeps its own lineage) and a few split between two or three tokens; when the split beam
ranks high its second token replaces the weakest beam. Each beam's uncertainty is its own, so
beams die one at a time, more often the more beams there are. VOCAB matters little (at least
`2·W` candidates per beam, as vLLM takes): with so small an ALPHA the third-largest probability
is negligible.

ALPHA is one number for every width, fitted by hand to the PagedAttention paper's beam-search
memory savings on ShareGPT (§6.3, Fig. 15: 44.3–66.3 % over widths 2, 4 and 6). On the shipped
ShareGPT-like scenario (scenarios/paper-paged.yaml at 0.5 req/s) it gives about 43.0, 62.0 and
67.2 %: the paper's spread from width 2 to 6 is a little wider than beams dying one at a time
reach. (The previous model, one distribution shared by all beams over 2·W tokens, gave 37.8 and
71.0 % at widths 2 and 6.) Savings are blocks saved ÷ blocks without sharing, time-weighted over
the run's steps (`kvsim.metrics`), the paper's definition. Not reproduced: the paper's Alpaca
range (37.6–55.2 %); with Alpaca's mean lengths (19 + 58 tokens, lognormal shaped like the
ShareGPT scenario's) and 16-token blocks even beams
that share every full block save at most about 38 % at width 2, so the paper's Alpaca beams must
coalesce within a block, which no single ALPHA does while ShareGPT's keep diverging (this model:
about 23–34 % there).
"""

from __future__ import annotations

import numpy as np

ALPHA = 0.0015  # fitted to PagedAttention §6.3 (see the module docstring); one value for all widths
VOCAB = 32  # candidate tokens per beam: at least 2·W (wider beams use 2·W)


def select_beams(scores: np.ndarray, rng: np.random.Generator) -> tuple[list[int], np.ndarray]:
    """(parent index of each new beam, the new beams' scores), best first; `scores` are the W current beams'.

    The 1e-300 floor keeps a token of probability 0 a (never chosen) finite candidate.
    """
    width = len(scores)
    log_probs = np.log(rng.dirichlet(np.full(max(VOCAB, 2 * width), ALPHA), size=width) + 1e-300)
    candidates = scores[:, None] + log_probs  # width × vocabulary candidate scores
    best = np.argsort(candidates, axis=None, kind="stable")[::-1][:width]
    parents, _ = np.unravel_index(best, candidates.shape)
    return [int(p) for p in parents], candidates.ravel()[best]
