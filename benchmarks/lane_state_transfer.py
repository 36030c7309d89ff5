"""What a lane's state costs to move between replica groups, against re-simulating the lane (issue 49).

    python benchmarks/lane_state_transfer.py [--lanes 8] [--seq-len 2048] [--rows-per-lane 2] [--steps 20]

Under torchft a survivor must produce a dead group's lanes from their state at the start of the step. Two ways
keep the groups coupled only through torchft's Manager: every group receives every lane's end-of-step state
(bytes per lane and step, sent inside the step's own all-reduce or torchft's healing state dict), or a group
re-simulates a lane from a state it has (CPU per step of the lane). This measures both with the real engine on
the test corpus (examples/corpus.py: prose JSONL and code Parquet, a byte-level BPE trained on them):

- `entry bytes`: one lane's sealed checkpoint entry (engine/resume.LaneEntry, canonical JSON) after each step,
  largest and mean, and the fixed slot loader/state.py stores it in (resume.lane_capacity);
- `re-simulate`: CPU seconds per step of one lane (its R rows produced by a fresh LaneStream from the previous
  step's state, the rows dropped), after the lane's first step (start-up excluded), beside the same step in the
  lane's own stream. Both find the lane's blocks already read in this process (Source reads a block once per
  process), so a survivor that never read them pays the reads on top.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "examples")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rows-per-lane", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    import corpus

    from zephon_titan.engine.resume import LaneEntry, canonical, lane_capacity
    from zephon_titan.engine.stream import LaneStream, StepClock
    from zephon_titan.testing import spec_from_table

    root = tempfile.mkdtemp(prefix="lane-transfer-")
    prose, code = corpus.prose_documents(), corpus.code_documents(max_files=40)
    tokenizer = corpus.train_tokenizer(prose + code, os.path.join(root, "tokenizer"), vocab_size=2000)
    corpus.write_jsonl(prose, os.path.join(root, "prose"), num_files=3)
    corpus.write_parquet(code, os.path.join(root, "code"), num_files=3, row_group_size=4)
    table = corpus.two_source_table(root, tokenizer, args.lanes)
    spec = spec_from_table(table, seq_len=args.seq_len)
    r = args.rows_per_lane
    sizes: list[int] = []
    cpu: list[float] = []
    steady: list[float] = []
    for lane in range(args.lanes):
        stream = LaneStream(spec, lane, clock=StepClock(r))
        stream.take(r)  # the first step: the lane's start-up (first blocks read, tokenizer warm), not a step's cost
        for _ in range(args.steps):
            state = stream.state()
            again = LaneStream(spec, lane, state, StepClock(r, state.rows, state.rows // r))
            started = time.process_time()
            again.take(r)  # a survivor re-simulating this lane's step from the state it has
            cpu.append(time.process_time() - started)
            started = time.process_time()
            stream.take(r)
            steady.append(time.process_time() - started)
            entry = LaneEntry(stream.state(), [0] * len(spec.sources), 0).to_entry("0" * 64)
            sizes.append(len(canonical(entry)))
    per_step, own = sorted(cpu), sorted(steady)
    print(f"lanes {args.lanes}, rows of {args.seq_len} tokens, {r} rows per lane and step, {args.steps} steps each")
    print(
        f"entry bytes: max {max(sizes)}, mean {sum(sizes) / len(sizes):.0f} (slot {lane_capacity(len(spec.sources))})"
    )
    print(
        f"re-simulate one lane-step (a fresh LaneStream at its state): mean {sum(cpu) / len(cpu) * 1e3:.2f} ms CPU, "
        f"max {per_step[-1] * 1e3:.1f} ms, {r * args.seq_len} tokens"
    )
    print(
        f"the same step in the lane's own stream: mean {sum(steady) / len(steady) * 1e3:.2f} ms CPU, "
        f"max {own[-1] * 1e3:.1f} ms (the lane reads and tokenizes documents in batches: steps are uneven)"
    )


if __name__ == "__main__":
    main()
