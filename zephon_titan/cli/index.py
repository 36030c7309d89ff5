"""`index` lists the files of every source that names an index and writes it (or, with --check, says
whether it still matches the files): one manifest for every rank to read instead of listing a bucket."""

from __future__ import annotations

import time

from zephon_titan.errors import ZephonError


def cmd_index(args) -> int:
    from zephon_titan.engine.sources import open_source
    from zephon_titan.engine.sources.index import read_index, write_index
    from zephon_titan.engine.sources.storage import StorageOptions
    from zephon_titan.job_file import read_job_file

    config = read_job_file(args.config).data  # the [dataloader] table: no torch, no TorchTitan
    sources = [s for s in config.sources if s.index]
    if not sources:
        raise ZephonError(
            f'no source of {args.config} has an index; add index = "<path or URI>" to a '
            "[dataloader.sources.<name>] table"
        )
    options, stale = StorageOptions.of(config), 0
    for source in sources:
        start = time.perf_counter()
        listed = open_source(source, max_document_chars=config.max_document_chars, options=options, use_index=False)
        seconds = time.perf_counter() - start
        summary = f"{len(listed.files):,} files, {listed.num_blocks:,} blocks (listed in {seconds:.2f} s)"
        if not args.check:
            write_index(source, listed, options)
            print(f"{source.name}: wrote {source.index}: {summary}")
            continue
        indexed = read_index(source, options)
        problems = _index_differences(indexed[1] if indexed else None, listed.files)
        stale += bool(problems)
        print(
            f"{source.name}: {source.index}: "
            + ("up to date, " + summary if not problems else "STALE: " + "; ".join(problems))
        )
    return 1 if stale else 0


def _index_differences(indexed, listed) -> list[str]:
    """What changed between the index and the files listed now, and how to rebuild it (empty: up to date)."""
    if indexed is None:
        return ["missing (write it with `zephon-titan index CONFIG`)"]
    old, new = {f.path: f for f in indexed}, {f.path: f for f in listed}
    problems = [f"{p} is gone" for p in sorted(set(old) - set(new))]
    problems += [f"{p} is new" for p in sorted(set(new) - set(old))]
    problems += [
        f"{p} changed ({old[p].size:,} -> {new[p].size:,} bytes, {old[p].num_blocks} -> {new[p].num_blocks} blocks)"
        for p in sorted(set(old) & set(new))
        if old[p] != new[p]
    ]
    if problems:
        problems.append(
            "rebuild it with `zephon-titan index CONFIG` (a run resumed on the rebuilt index sees "
            "the changed files; finish or restart runs that use the old one)"
        )
    return problems
