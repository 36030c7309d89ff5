"""The loader layer: torch, never TorchTitan. What any trainer adapter (titan/ for TorchTitan 0.3, a sibling for
the next release) shares: which rows a DP rank produces and the collectives that keep ranks in step
(rank_lanes.py), the loader's state in a DCP checkpoint and its one resume sequence (state.py), checkpoints read
without running them (checkpoint.py), a checkpoint save that fails on the disk (save_failure.py), the steps
produced ahead of the trainer (prefetch.py)."""
