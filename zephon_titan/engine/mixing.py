"""Token-weighted mixing: which source gives the lane its next piece, and how big it is.

Pieces. A lane takes a document in pieces of at most C tokens (`mix_chunk_tokens`, default
seq_len) and keeps one open document per source, so a book does not hold a lane for
hundreds of steps: other sources' pieces come between its pieces. A piece is a whole
document when the document is shorter. In a row, a piece that directly follows the same
document's previous piece continues its attention block (positions go on, as in TorchTitan's
loader); one that resumes a document after other pieces starts a new block (positions from 0).

Rule (earliest virtual finish first): with t_s tokens taken from source s, the lane takes
its next piece from the active source with the smallest

    p_s = (t_s + phi_s * C) / w_s        (ties: the lower source index)

where phi_s in [0, 1) is the lane's phase for source s: phi_{l,s} = frac((l + 1/2) / L + u_s), with
u_s = s / S for a run's S sources (s: the index in name order). Across the L lanes each source's
"next piece due" times are evenly spread, and inside a lane the S sources are as far apart as they
can be; so the lanes' first steps together already hold each source in proportion to its weight
(without phases every lane would start with the heaviest source and stay in step with the others).
Measured on a 3-source debug job, evenly spaced source offsets gave per-step errors of 0.13-0.18
where keyed random offsets gave 0.11-0.24 (tests/unit/test_mixture_per_step.py), and offsets keyed by
the source's name 0.15-0.27 (issue 29). Pure arithmetic on the state, no randomness.

Sources added at a resume. The offsets u_s are kept: the checkpoint records them when they are not
s / S (fingerprint.py's `mix_phases`), and each added source takes the middle of the widest gap
between the offsets already taken (added_offsets). So no source already there changes phase, and a
source resting until step k leaves every step before k as the first plan had it (issue 29; before,
u_s = s / S over the new S moved every phase).

Bound. When s is picked, p_s <= p_r for every r, and a piece of n <= C tokens raises p_s by
n / w_s, so p_s - p_r <= C / w_s holds at all times (it holds at the start: phi_s < 1).
Writing T = sum t_r and sum w_r = 1, w_s * T - t_s = -w_s * sum_r w_r (p_s - p_r) + phi_s * C -
w_s * C * sum_r phi_r, and each term is bounded:

    |w_s * T - t_s|  <=  (1 + S * w_s) * C  <=  (S + 1) * C       for every source s,

S sources: a function of the piece size, not of the longest document. Under the
`redistribute` policy the same rule runs over the active sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction


def lane_phases(
    source_names: Sequence[str], lane: int, num_lanes: int, offsets: Sequence[Fraction] | None = None
) -> tuple[float, ...]:
    """phi_{l,s}: lane l's phase for each source, evenly spread over the lanes; `offsets`: the u_s kept from a
    checkpoint (None: s / S). A Fraction's float is correctly rounded, as s / S is: the same phases."""
    us = offsets if offsets is not None else initial_offsets(len(source_names))
    return tuple(((lane + 0.5) / num_lanes + float(u)) % 1.0 for u in us)


def initial_offsets(count: int) -> tuple[Fraction, ...]:
    """u_s of a run's own sources: s / S, as far apart as they can be."""
    return tuple(Fraction(s, count) for s in range(count))


def added_offsets(kept: dict[str, Fraction], names: Sequence[str]) -> dict[str, Fraction]:
    """Every source's u_s after a resume with the sources `names`: the kept ones as they were, each added one
    (in name order) in the middle of the widest gap between those taken (ties: the lowest), so the others
    never move and the sources stay spread."""
    out = dict(kept)
    for name in names:
        if name in out:
            continue
        taken = sorted(set(out.values())) or [Fraction(0)]
        gaps = [(b - a, a) for a, b in zip(taken, taken[1:] + [taken[0] + 1])]
        width = max(w for w, _ in gaps)
        start = min(a for w, a in gaps if w == width)
        out[name] = (start + width / 2) % 1
    return {name: out[name] for name in names}


def choose_source(
    weights: Sequence[float], tokens: Sequence[int], active: Sequence[bool], phases: Sequence[float], chunk: int
) -> int:
    """Index of the source that gives the next piece, or -1 if none is active."""
    best, best_due = -1, 0.0
    for s, (w, t, a, phi) in enumerate(zip(weights, tokens, active, phases)):
        if not a:
            continue
        due = (t + phi * chunk) / w
        if best < 0 or due < best_due:
            best, best_due = s, due
    return best
