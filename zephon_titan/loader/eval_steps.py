"""One DP rank's steps of the eval set and their microbatches, for any trainer adapter (torch, never TorchTitan).

The eval set (engine/eval_set.py) is a finite sequence of steps of `global_batch_size` rows from the lanes' initial
state, the same bytes for every W. DP rank r of W takes the same part of each eval step as of a training step
(loader/rank_lanes.py: its rows, the lanes it produces whole and the lanes it owns), cut into microbatches by the
same RankLanes.microbatches as the training loader (loader/rank_steps.py). Nothing is consumed or saved: every
validation starts the eval set over. An adapter (titan/validator.py for TorchTitan 0.3) only puts the microbatches
in its trainer's shapes and computes the loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from zephon_titan.config import DataConfig
from zephon_titan.engine.eval_set import EvalStep, eval_steps
from zephon_titan.engine.packing import packer_class
from zephon_titan.loader.rank_lanes import Microbatch, RankLanes, any_rank


class RankEvalSteps:
    """One DP rank's eval steps and their microbatches (see the module's docstring)."""

    def __init__(self, data: DataConfig, **layout: Any):
        """`layout`: RankLanes.build's keywords (the batch layout, this rank, seq_len and the tokenizer), as RankSteps
        takes them."""
        packer_class(data.packing)  # at build, not at the first row (config/ cannot see the packer registry)
        self.lanes = RankLanes.build(data, **layout)
        self.spec = self.lanes.spec
        self.local_batch_size = self.lanes.local_batch_size

    def check_not_empty(self) -> None:
        """An eval set without a single row is a ConfigError (engine/eval_set.py), now rather than a silent loss of
        0 at the first validation; a collective under torchrun."""
        next(iter(self.steps(1)), None)

    def steps(self, max_steps: int = -1) -> Iterator[EvalStep]:
        """The eval set's steps (every lane this rank produces, whole); a collective per step under torchrun."""
        return eval_steps(self.spec, self.lanes.lane_ids, self.lanes.rows_per_lane, max_steps, any_rank)

    def step_microbatches(self, step: EvalStep) -> Iterator[Microbatch]:
        """This rank's rows of the step, in microbatches of local_batch_size rows."""
        return self.lanes.microbatches(self.lanes.mine(step.rows))
