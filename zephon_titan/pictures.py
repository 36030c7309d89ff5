"""Pictures drawn as SVG text, with no plotting dependency (and no torch): what `plan --plot` and `validate --plot`
write, and the demo's token_shares.svg.

shares_svg draws each source's share of the tokens of every step (top panel) and of all steps so far (bottom
panel) against its target weight, dashed: under a schedule the target moves with the phases (and their ramps),
so it is drawn per step. Every element a reader (or a test) needs is marked: `class="share"` polylines with
`data-source` and `data-panel`, `class="target"` polylines, `class="ytick"`/`class="xtick"` lines with
`data-value`.

draws_svg draws, for each source, its training tokens per epoch (a light bar, `class="epoch"`) and what the run's
steps draw from it (a dark bar, `class="drawn"`), labelled with the number of epochs that is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
WIDTH = 760
PANEL_HEIGHT = 210
LEFT, RIGHT, TOP = 64, 130, 78  # margins: the y tick labels; the target labels; the title and the legend
GAP = 64  # between the panels: the top panel's x ticks and the bottom panel's caption
MAX_POINTS = 1500  # longer plans are drawn every k-th step (each panel's last step always)


def nice_ticks(first: float, last: float, most: int = 8) -> list[float]:
    """Round values (1, 2 or 5 times a power of ten apart) from `first` to `last`, at most `most` of them."""
    if last <= first:
        return [first]
    raw = (last - first) / max(most - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    spacing = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    start = math.ceil(first / spacing) * spacing
    return [start + i * spacing for i in range(int((last - start) / spacing + 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:g}"


def shares_svg(
    names: Sequence[str],
    steps: Sequence[int],
    shares: Sequence[Sequence[float]],
    cumulative: Sequence[Sequence[float]],
    targets: Sequence[Sequence[float]],
    title: str,
) -> str:
    """The picture of a mixture (plan.MixtureReport's fields): shares[i][s] is source s's share of step
    steps[i]'s tokens, cumulative[i][s] of steps[0..i]'s, targets[i][s] its weight at that step (normalized). The
    cumulative panel's target is what its share should follow: the mean of the targets of steps[0..i] (a schedule's
    change moves it slowly, as it moves the cumulative share)."""
    if not steps:
        raise ValueError("no steps to draw")
    keep = sorted({*range(0, len(steps), math.ceil(len(steps) / MAX_POINTS)), len(steps) - 1})
    first, last = steps[0], steps[-1]
    inner_w = WIDTH - LEFT - RIGHT
    height = TOP + 2 * PANEL_HEIGHT + GAP + 40

    def x(step: float) -> float:
        return LEFT + inner_w * ((step - first) / (last - first) if last > first else 0.5)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{LEFT + inner_w / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
    ]
    running = [[sum(t[s] for t in targets[: i + 1]) / (i + 1) for s in range(len(names))] for i in range(len(steps))]
    panels = (
        ("step", "share of each step's tokens", shares, targets, TOP),
        ("cumulative", "share of all tokens up to the step", cumulative, running, TOP + PANEL_HEIGHT + GAP),
    )
    for panel, caption, values, goals, top in panels:
        bottom = top + PANEL_HEIGHT

        def y(share: float, top: float = top) -> float:
            return top + PANEL_HEIGHT * (1 - share)

        out.append(f'<g class="panel" data-panel="{panel}">')
        out.append(f'<text x="{LEFT}" y="{top - 8}" font-size="13">{escape(caption)}</text>')
        for tick in (0, 0.25, 0.5, 0.75, 1):
            out.append(
                f'<line class="ytick" data-value="{tick}" x1="{LEFT}" y1="{y(tick):.2f}" x2="{LEFT + inner_w}" '
                f'y2="{y(tick):.2f}" stroke="#e4e4e4"/>'
            )
            out.append(f'<text x="{LEFT - 6}" y="{y(tick) + 4:.2f}" text-anchor="end">{tick:g}</text>')
        ticks = nice_ticks(first, last)
        if ticks[0] - first > (last - first) * 0.08:  # the first step too, where no round tick is near it
            ticks.insert(0, first)
        for tick in ticks:
            out.append(
                f'<line class="xtick" data-value="{tick:g}" x1="{x(tick):.2f}" y1="{bottom}" x2="{x(tick):.2f}" '
                f'y2="{bottom + 5}" stroke="black"/>'
            )
            out.append(f'<text x="{x(tick):.2f}" y="{bottom + 18}" text-anchor="middle">{_label(tick)}</text>')
        out.append(f'<rect x="{LEFT}" y="{top}" width="{inner_w}" height="{PANEL_HEIGHT}" fill="none" stroke="black"/>')
        out.append(f'<text x="{LEFT + inner_w / 2}" y="{bottom + 34}" text-anchor="middle">step</text>')
        middle = top + PANEL_HEIGHT / 2
        out.append(f'<text x="16" y="{middle}" text-anchor="middle" transform="rotate(-90 16 {middle})">share</text>')
        for s, name in enumerate(names):
            color = COLORS[s % len(COLORS)]
            target = " ".join(f"{x(steps[i]):.2f},{y(goals[i][s]):.2f}" for i in keep)
            out.append(
                f'<polyline class="target" data-source="{escape(name)}" points="{target}" fill="none" '
                f'stroke="{color}" stroke-width="1.5" stroke-dasharray="6,4"/>'
            )
            points = " ".join(f"{x(steps[i]):.2f},{y(values[i][s]):.2f}" for i in keep)
            out.append(
                f'<polyline class="share" data-source="{escape(name)}" data-panel="{panel}" points="{points}" '
                f'fill="none" stroke="{color}" stroke-width="{1.2 if panel == "step" else 2}"/>'
            )
        out.extend(_target_labels(names, goals[-1], y, LEFT + inner_w + 6))
        out.append("</g>")
    out.extend(_legend(names, LEFT, 42))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _target_labels(names: Sequence[str], weights: Sequence[float], y, left: float) -> list[str]:
    """Each source's last target, written at its height right of the panel (pushed apart where they meet)."""
    order = sorted(range(len(names)), key=lambda s: -weights[s])
    placed: list[float] = []
    out = []
    for s in order:
        at = y(weights[s]) + 4
        if placed and at - placed[-1] < 13:
            at = placed[-1] + 13
        placed.append(at)
        color = COLORS[s % len(COLORS)]
        out.append(
            f'<text class="target-label" x="{left}" y="{at:.2f}" fill="{color}">'
            f"{escape(names[s])} {weights[s]:.3g}</text>"
        )
    return out


def _legend(names: Sequence[str], left: float, top: float) -> list[str]:
    """One row under the title: each source's colour, then what a solid and a dashed line are."""
    out = [f'<g class="legend" transform="translate({left},{top})">']
    at = 0.0
    for s, name in enumerate(names):
        color = COLORS[s % len(COLORS)]
        out.append(f'<rect x="{at:.1f}" y="-9" width="12" height="12" fill="{color}"/>')
        out.append(f'<text class="legend-source" x="{at + 17:.1f}" y="2">{escape(name)}</text>')
        at += 34 + 7 * len(name)
    at += 12
    out.append(f'<line x1="{at:.1f}" y1="-3" x2="{at + 24:.1f}" y2="-3" stroke="black" stroke-width="2"/>')
    out.append(f'<text x="{at + 30:.1f}" y="2">share</text>')
    at += 80
    out.append(
        f'<line x1="{at:.1f}" y1="-3" x2="{at + 24:.1f}" y2="-3" stroke="black" stroke-width="1.5" '
        'stroke-dasharray="6,4"/>'
    )
    out.append(f'<text x="{at + 30:.1f}" y="2">target weight</text>')
    out.append("</g>")
    return out


def _tokens(value: float) -> str:
    """1.5M, 320K, 12,000."""
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= size:
            return f"{value / size:g}{unit}"
    return f"{value:,.0f}"


def draws_svg(names: Sequence[str], drawn: Sequence[float], per_epoch: Sequence[float], title: str) -> str:
    """Each source's row: its tokens per epoch and the tokens the run draws from it, on one token axis."""
    row_height, top = 40, 70
    left = 24 + 7 * max(len(n) for n in names)  # the source names
    inner_w = WIDTH - left - RIGHT
    height = top + row_height * len(names) + 50
    ticks = nice_ticks(0, max([*drawn, *per_epoch, 1.0]), 6)
    most = ticks[-1] if ticks[-1] >= max([*drawn, *per_epoch]) else ticks[-1] + (ticks[1] - ticks[0])
    ticks = ticks if ticks[-1] == most else [*ticks, most]

    def x(tokens: float) -> float:
        return left + inner_w * tokens / most

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left + inner_w / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
        f'<g class="legend" transform="translate({left},44)"><rect x="0" y="-9" width="12" height="12" '
        'fill="#c6dbef"/><text x="17" y="2">one epoch of the source</text><rect x="190" y="-9" width="12" '
        'height="12" fill="#08519c"/><text x="207" y="2">what the run draws (label: epochs)</text></g>',
    ]
    bottom = top + row_height * len(names)
    for tick in ticks:
        out.append(
            f'<line class="xtick" data-value="{tick:g}" x1="{x(tick):.2f}" y1="{top}" x2="{x(tick):.2f}" '
            f'y2="{bottom + 5}" stroke="#e4e4e4"/>'
        )
        out.append(f'<text x="{x(tick):.2f}" y="{bottom + 18}" text-anchor="middle">{_tokens(tick)}</text>')
    out.append(f'<text x="{left + inner_w / 2}" y="{bottom + 36}" text-anchor="middle">tokens</text>')
    for s, name in enumerate(names):
        y = top + row_height * s + 6
        epochs = drawn[s] / per_epoch[s] if per_epoch[s] else float("inf")
        out.append(f'<text x="{left - 6}" y="{y + 17}" text-anchor="end">{escape(name)}</text>')
        out.append(
            f'<rect class="epoch" data-source="{escape(name)}" data-tokens="{per_epoch[s]:.0f}" x="{left}" '
            f'y="{y}" width="{x(per_epoch[s]) - left:.2f}" height="26" fill="#c6dbef"/>'
        )
        out.append(
            f'<rect class="drawn" data-source="{escape(name)}" data-tokens="{drawn[s]:.0f}" x="{left}" '
            f'y="{y + 8}" width="{x(drawn[s]) - left:.2f}" height="10" fill="#08519c"/>'
        )
        label = f"{epochs:.2f} epochs" if epochs != float("inf") else "no tokens"
        out.append(f'<text x="{max(x(drawn[s]), x(per_epoch[s])) + 6:.2f}" y="{y + 17}">{label}</text>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="black"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
