"""Each step's global-batch SHA-256 (the ledger's digest), from the engine alone, to compare machines.

    python scripts/step_hashes.py JOB.toml --steps 30 [--workers 2] [--seq-len 2048] [--rows-per-lane 8]

`zephon-titan plan` writes the same digests from a whole job, which needs TorchTitan's trainer to import.
This needs the `[dataloader]` table only, with `tokenizer_path` set, so it also runs where TorchTitan cannot
(a GPU image with an older torch). Run it on two machines, or with other worker counts or backends, and
diff the output: the rows must not depend on any of them.
"""

from __future__ import annotations

import argparse
import sys

from zephon_titan.engine import batch_digest, build_engine, lane_digest, open_lane_group
from zephon_titan.titan.tokenizer import loader_tokenizer
from zephon_titan.toml_file import load_data_config


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", help="a job TOML whose [dataloader] sets tokenizer_path")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--workers", type=int, default=0, help="worker processes (0: in process)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--rows-per-lane", type=int, default=8, help="rows each lane gives per step")
    args = p.parse_args()
    data = load_data_config(args.job)
    if not data.tokenizer_path:
        p.error(f"{args.job}: set [dataloader] tokenizer_path (the trainer's tokenizer is not built here)")
    spec = build_engine(data, args.seq_len, loader_tokenizer(data, lambda: None))
    with open_lane_group(spec, range(data.num_lanes), args.rows_per_lane, args.workers, 2) as group:
        for step in range(1, args.steps + 1):
            print(step, batch_digest(lane_digest(rows) for rows in group.next_step()), flush=True)
    print(f"backend in this process: {spec.tokenizer.select_backend(announce=False)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
