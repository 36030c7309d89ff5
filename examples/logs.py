"""Reading TorchTitan's console log (losses per step) for tests and the demo."""

from __future__ import annotations

import re

STEP_LINE = re.compile(r"step:\s+(\d+)\s+loss:\s+([0-9.]+)")  # TorchTitan's metrics line (no colours)


def parse_losses(output: str) -> dict[int, float]:
    """{step: loss} from TorchTitan's metric lines (run with --metrics.disable_color_printing)."""
    return {int(step): float(loss) for step, loss in STEP_LINE.findall(output)}
