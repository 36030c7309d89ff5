"""Under torchrun: several runs of data_run or of the CPU trainer, one after another in this process, each
exactly as its own command would run it (`main(args)`), so that the imports and the launch, most of a run
that is refused before its first step, are paid once:

    torchrun --nproc_per_node 1 tests/integration/run_each.py train_cpu -- ARGS... -- ARGS...

Before and after each run, a line on stderr: `=== run I` and `=== run I: exit RC`.
"""

from __future__ import annotations

import sys

import torch.distributed as dist


def _groups(argv: list[str]) -> list[list[str]]:
    groups: list[list[str]] = []
    for arg in argv:
        if arg == "--":
            groups.append([])
        else:
            groups[-1].append(arg)
    return groups


def main() -> None:
    what, runs = sys.argv[1], _groups(sys.argv[2:])
    if what == "train_cpu":
        from zephon_titan.cpu import prepare_cpu_config
        from zephon_titan.train_cpu import main as train  # installs the CPU device shim first

        def run(args: list[str]) -> int:
            train(args, prepare=prepare_cpu_config)
            return 0
    else:
        from zephon_titan.titan.data_run import main as run  # type: ignore[assignment]

    for i, args in enumerate(runs):
        print(f"=== run {i}", file=sys.stderr, flush=True)
        try:
            code = run(args)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        if dist.is_initialized():
            dist.destroy_process_group()
        print(f"=== run {i}: exit {code}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
