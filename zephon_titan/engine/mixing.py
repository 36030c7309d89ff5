"""Token-weighted mixing: which source gives the lane its next document.

Rule (largest deficit first): with T tokens taken so far, of which t_s from source s,
take the next document from the active source with the largest deficit
w_s * T - t_s (ties: the larger weight, then the lower source index). It is pure integer/float
arithmetic on the state, with no randomness.

Bound. Deficits always sum to 0. A source is only picked when its deficit is the
largest, hence >= 0, and a document of n tokens then lowers it by n * (1 - w_s);
so no deficit ever drops below -D, where D is the longest document (in tokens,
BOS/EOS included). With S sources the largest deficit is then at most (S - 1) * D:

    -(1 - w_s) * D  <=  w_s * T - t_s  <=  (S - 1) * D        for every source s.

Under the `redistribute` policy the same rule runs over the active sources with
their weights renormalized, T counting only the active sources' tokens.
"""

from __future__ import annotations

from collections.abc import Sequence


def mixture_error_bound(num_sources: int, longest_document: int) -> int:
    """The largest |w_s * T - t_s| the rule allows (see the module docstring)."""
    return max(num_sources - 1, 1) * longest_document


def choose_source(weights: Sequence[float], tokens: Sequence[int], active: Sequence[bool]) -> int:
    """Index of the source that gives the next document, or -1 if none is active."""
    total_weight = 0.0
    total_tokens = 0
    for w, t, a in zip(weights, tokens, active):
        if a:
            total_weight += w
            total_tokens += t
    best, best_deficit = -1, 0.0
    for s, (w, t, a) in enumerate(zip(weights, tokens, active)):
        if not a:
            continue
        deficit = w / total_weight * total_tokens - t
        if best < 0 or deficit > best_deficit or (deficit == best_deficit and w > weights[best]):
            best, best_deficit = s, deficit
    return best
