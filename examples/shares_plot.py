"""An SVG picture of the cumulative token share of each source over steps, from a ledger.

No plotting dependency: a few polylines, with the configured weights as dashed lines.
"""

from __future__ import annotations

from collections.abc import Sequence

from zephon_titan.engine.ledger import LedgerEntry

_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
W, H, PAD = 640, 320, 48


def shares_svg(entries: Sequence[LedgerEntry], weights: dict[str, float], title: str) -> str:
    names = list(weights)
    totals = dict.fromkeys(names, 0)
    series = {name: [] for name in names}
    for entry in entries:
        for name in names:
            totals[name] += entry.tokens.get(name, 0)
        all_tokens = sum(totals.values()) or 1
        for name in names:
            series[name].append(totals[name] / all_tokens)
    n = max(len(entries), 2)

    def x(i: float) -> float:
        return PAD + (W - 2 * PAD) * i / (n - 1)

    def y(share: float) -> float:
        return H - PAD - (H - 2 * PAD) * share

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
        f'<line x1="{PAD}" y1="{y(0)}" x2="{W - PAD}" y2="{y(0)}" stroke="black"/>',
        f'<line x1="{PAD}" y1="{y(0)}" x2="{PAD}" y2="{y(1)}" stroke="black"/>',
        f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">step (1-{len(entries)})</text>',
    ]
    for tick in (0, 0.25, 0.5, 0.75, 1):
        parts.append(f'<text x="{PAD - 6}" y="{y(tick) + 4}" text-anchor="end">{tick:.2f}</text>')
    for k, name in enumerate(names):
        color = _COLORS[k % len(_COLORS)]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(series[name]))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        parts.append(
            f'<line x1="{PAD}" y1="{y(weights[name]):.1f}" x2="{W - PAD}" y2="{y(weights[name]):.1f}" '
            f'stroke="{color}" stroke-dasharray="5,4"/>'
        )
        parts.append(f'<text x="{W - PAD + 4}" y="{y(weights[name]) + 4:.1f}" fill="{color}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
