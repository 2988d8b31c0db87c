"""Which beams survive a beam-search step: real beam search over drawn next-token distributions.

Beam search keeps the `W` highest-scoring continuations (cumulative log-probability) out of
every beam's candidates, as vLLM v0 did (vllm/model_executor/layers/sampler.py
`_beam_search_sample`: the top `2·W` candidates of the group, of which the best `W` unfinished
ones are kept; kvsim's beams never stop early, so that is the best `W`). A beam whose next token
is uncertain fills several slots with its alternatives and the weakest beams die, so the
survivors share long prefixes. kvsim has no model weights, so each beam's next-token
distribution is drawn, and depends on the beam's rank r (1 = the best score):

    beam of rank r's next-token distribution   p ~ Dirichlet(ALPHA / r**RANK_EXPONENT, ...) over VOCAB tokens
    candidate score                            beam score + log p(token)
    survivors                                  the W best of the W · VOCAB candidates

A small concentration makes a draw nearly one-hot (the LM is sure of its next token, the beam
keeps its own lineage); now and then two or three tokens split the mass, and when that beam
ranks high its alternatives replace the weakest beams. The chance of such a split falls as
1/r down the ranking: the best hypotheses branch, the lower ones mostly carry on. So deaths
come mostly from the top beams' alternatives and grow more slowly than the width (per step:
0.036, 0.070 and 0.088 deaths at widths 2, 4 and 6), and the lower-ranked
hypotheses of a wide search keep lineages that diverged long ago: distinct output grows
faster than linearly in the width, as the paper's numbers require (a width-2 search's second
beam is about 17 % distinct, each extra beam of a width-6 search about 30 %).

The model is phenomenological: ALPHA and RANK_EXPONENT were fitted by hand to the
PagedAttention paper's beam-search memory savings on ShareGPT (§6.3, Fig. 15: 44.3–66.3 % over
widths 2, 4 and 6); it is not validated elsewhere. On the shipped ShareGPT-like scenario
(scenarios/paper-paged.yaml at 0.5 req/s) it gives 45.2, 61.8 and 64.2 %. Savings are blocks
saved ÷ blocks without sharing, time-weighted over the run's steps (`kvsim.results.metrics`), the
paper's definition. No rank-independent draw tried reached the range: with every beam's
distribution drawn alike (Dirichlet of any ALPHA or VOCAB, a Zipf base measure, branching steps
shared by all beams or drawn per beam, geometric rank profiles, vLLM's EOS stop rule) deaths per
step grew faster than the width (about W^1.6 for the plain Dirichlet) and the ratio of width-6
to width-2 savings stayed at 1.52 or more, while the paper's 66.3 / 44.3 is 1.497.

Out of sample, Alpaca-like lengths (means 19 + 58 tokens, lognormal shaped like the ShareGPT
scenario's) give 26.9, 31.6 and 30.8 % (2026-12-05; 27.6, 31.3, 31.8 when fitted), below the paper's
Alpaca range (37.6–55.2 %): with so
few tokens per 16-token block the paper's Alpaca beams must coalesce within a block more often
than these do.
"""

from __future__ import annotations

from functools import cache

import numpy as np

ALPHA = 0.01  # Dirichlet concentration of the best beam; fitted to PagedAttention §6.3 (module docstring)
RANK_EXPONENT = 1.0  # the rank-r beam's concentration is ALPHA / r**RANK_EXPONENT; fitted with ALPHA
VOCAB = 32  # candidate tokens per beam: at least 2·W (wider beams use 2·W)


def select_beams(scores: np.ndarray, rng: np.random.Generator) -> tuple[list[int], np.ndarray]:
    """(parent index of each new beam, the new beams' scores), best first; `scores` are the W current beams'.

    Ranks break ties by beam index (the first beam ranks first). The Dirichlet draw is taken in
    log space (log Gamma(a) = log Gamma(a + 1) + log(U) / a), because Gamma draws of so small a
    shape underflow to 0. Draws in C order (beam by beam, token by token): every Gamma, then every U.

    Hot (each step of each beam search): the Gamma draws are taken one beam at a time, a scalar shape
    each. That is the stream of one draw over the (W, 1) array of shapes (numpy draws a broadcast shape
    element by element in C order, with the same sampler) without that call's array checks and
    broadcasting: about half its time at W = 2 and 4; `tests/test_sharing.py` checks the two forms agree
    byte for byte.
    """
    width = len(scores)
    vocab = max(VOCAB, 2 * width)
    concentration = np.empty(width)  # each beam's, from its rank
    concentration[(-scores).argsort(kind="stable")] = _concentration_by_rank(width)
    candidates = np.empty((width, vocab))  # beam by beam, token by token
    for beam_candidates, beam_concentration in zip(candidates, concentration.tolist(), strict=True):
        rng.standard_gamma(beam_concentration + 1.0, out=beam_candidates)
    np.log(candidates, out=candidates)  # log Gamma(concentration + 1)
    log_u = rng.random(candidates.shape)
    np.log(np.subtract(1.0, log_u, out=log_u), out=log_u)
    log_u /= concentration[:, None]
    candidates += log_u  # log Gamma(concentration)
    candidates -= np.logaddexp.reduce(candidates, axis=1, keepdims=True)  # log p(token)
    candidates += scores[:, None]  # width × vocabulary candidate scores
    flat = candidates.ravel()  # beam-major: flat index // vocab is the parent
    best = flat.argsort(kind="stable")[:-width - 1:-1]  # the best first; a tie, the later candidate first
    return (best // vocab).tolist(), flat[best]


@cache
def _concentration_by_rank(width: int) -> np.ndarray:
    """ALPHA / r**RANK_EXPONENT of the beams of ranks r = 1 .. `width`, read-only (one array per width)."""
    concentration = ALPHA / np.arange(1.0, width + 1) ** RANK_EXPONENT
    concentration.flags.writeable = False
    return concentration
