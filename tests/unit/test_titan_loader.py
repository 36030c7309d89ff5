"""ZephonDataLoader as TorchTitan builds it (no torchrun): batches, validation, per-lane state."""

import pytest
import torch
from helpers import data_table
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from zephon_titan.config import config_from_dict
from zephon_titan.engine.resume import HEADER_KEY, lane_key
from zephon_titan.errors import ConfigError, ResumeError
from zephon_titan.loader.state import decode_entry
from zephon_titan.titan.dataloader import ZephonDataLoader

SEQ = 32


def _config(corpus_dir, tokenizer_dir, global_batch_size=16, **overrides):
    data = config_from_dict(data_table(corpus_dir, tokenizer_dir, **overrides))
    return ZephonDataLoader.Config(data=data, global_batch_size=global_batch_size)


def _build(config, world, rank, local=2, tokenizer=None):
    return config.build(dp_world_size=world, dp_rank=rank, tokenizer=tokenizer, seq_len=SEQ, local_batch_size=local)


def _steps(loaders, steps, local=2, global_batch=16):
    """Per step, every rank's microbatches concatenated in DP-rank order."""
    iters = [iter(loader) for loader in loaders]
    per_rank = global_batch // len(loaders) // local
    out = []
    for _ in range(steps):
        parts = [next(it) for it in iters for _ in range(per_rank)]
        out.append(torch.cat([torch.stack([p[0]["input"], p[0]["positions"], p[1]]) for p in parts], dim=1))
    return out


def _decoded(state):
    return {k: decode_entry(v, k) for k, v in state.items()}


def test_state_entries_are_tensors_not_python_objects(corpus_dir, tokenizer_dir):
    # DCP unpickles non-tensor values on load; tensors are read as raw bytes.
    state = _build(_config(corpus_dir, tokenizer_dir), 2, 0).state_dict()
    assert all(isinstance(v, torch.Tensor) and v.dtype == torch.uint8 for v in state.values())
    assert _decoded(state)[lane_key(0)]["state"]["lane_id"] == 0


def test_microbatches_have_titans_shapes(corpus_dir, tokenizer_dir):
    inputs, labels = next(iter(_build(_config(corpus_dir, tokenizer_dir), 1, 0, local=4)))
    assert set(inputs) == {"input", "positions"}
    assert inputs["input"].shape == inputs["positions"].shape == labels.shape == (4, SEQ)
    assert inputs["input"].dtype == labels.dtype == torch.int64


def test_state_moves_between_world_sizes_lane_by_lane(corpus_dir, tokenizer_dir):
    config = _config(corpus_dir, tokenizer_dir)
    reference = _steps([_build(config, 1, 0)], 5)
    first = [_build(config, 2, r) for r in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(_steps(first, 3), reference[:3]))
    saved = {}
    for loader in first:  # what DCP stores: the union of the ranks' keys
        saved.update(loader.state_dict())
    assert sorted(saved) == [HEADER_KEY] + [lane_key(lane) for lane in range(8)]
    second = [_build(config, 4, r) for r in range(4)]
    for loader in second:  # each rank asks for the lanes it owns now
        loader.load_state_dict({k: saved[k] for k in loader.state_dict()})
    assert all(torch.equal(a, b) for a, b in zip(_steps(second, 2), reference[3:]))
    other = [_build(_config(corpus_dir, tokenizer_dir, seed=8), 1, 0)]
    assert not torch.equal(_steps(other, 1)[0], reference[0])  # negative control


def test_tp_peers_of_a_dp_rank_have_identical_state(corpus_dir, tokenizer_dir):
    config = _config(corpus_dir, tokenizer_dir)
    peers = [_build(config, 2, 1) for _ in range(2)]
    _steps(peers[:1], 2, global_batch=8), _steps(peers[1:], 2, global_batch=8)
    assert _decoded(peers[0].state_dict()) == _decoded(peers[1].state_dict())


def test_state_is_what_was_consumed(corpus_dir, tokenizer_dir):
    config = _config(corpus_dir, tokenizer_dir)
    loader = _build(config, 1, 0)
    batches = iter(loader)

    def rows_per_lane() -> set[int]:
        entries = {k: v for k, v in _decoded(loader.state_dict()).items() if k != HEADER_KEY}
        return {entry["state"]["rows"] for entry in entries.values()}

    # A step is consumed when its last microbatch is handed over (TorchTitan saves between steps; a step whose
    # optimizer step never ran is produced again whole). One step: 16 rows, 8 microbatches of 2, R = 2.
    next(batches)  # lane 0's rows 0 and 1: the step is not consumed yet
    assert rows_per_lane() == {0}
    for _ in range(7):
        next(batches)
    assert rows_per_lane() == {2}  # every lane stands at the end of step 1
    next(batches)  # the first microbatch of step 2, and the prefetcher may run ahead: still step 1
    assert rows_per_lane() == {2}


def test_fingerprint_mismatch_names_the_change(corpus_dir, tokenizer_dir):
    saved = _build(_config(corpus_dir, tokenizer_dir), 1, 0).state_dict()
    loader = _build(_config(corpus_dir, tokenizer_dir, seed=9, packing="best_fit"), 1, 0)
    with pytest.raises(ResumeError, match=r"packing: wrap -> best_fit\(window_docs=256\); seed: 7 -> 9"):
        loader.load_state_dict(saved)


def test_trainer_tokenizer_is_the_default(corpus_dir, tokenizer_dir):
    titan_tokenizer = HuggingFaceTokenizer(HuggingFaceTokenizer.Config(), tokenizer_path=tokenizer_dir)
    explicit = _steps([_build(_config(corpus_dir, tokenizer_dir), 1, 0)], 2)
    default = _steps(
        [_build(_config(corpus_dir, tokenizer_dir, tokenizer_path=""), 1, 0, tokenizer=titan_tokenizer)], 2
    )
    assert all(torch.equal(a, b) for a, b in zip(explicit, default))


@pytest.mark.parametrize(
    "global_batch, world, local, message",
    [
        (-1, 2, 2, r"training.global_batch_size must be set explicitly"),
        (
            16,
            3,
            2,
            r"data-parallel size is 3, which does not divide training.global_batch_size = 16 rows per step; valid "
            r"data-parallel sizes: \[1, 2, 4, 8\] with local_batch_size = 2 \(.*; \[1, 2, 4, 8, 16\] with a "
            r"smaller",
        ),
        (20, 2, 2, r"global batch size 20 is not a positive multiple of num_lanes 8"),
        (
            16,
            4,
            3,
            r"global_batch_size / 4 = 4 rows per step, which is not a multiple of training.local_batch_size = 3; use a local_batch_size in \[1, 2, 4\]",
        ),
    ],
)
def test_startup_validation(corpus_dir, tokenizer_dir, global_batch, world, local, message):
    with pytest.raises(ConfigError, match=message):
        _build(_config(corpus_dir, tokenizer_dir, global_batch_size=global_batch), world, 0, local=local)


def test_in_process_prefetch_gives_the_rows_of_a_worker_process(corpus_dir, tokenizer_dir):
    # num_workers = 0 produces steps in a prefetch thread (torchdata's Prefetcher); 1 in a worker process.
    in_process = _steps([_build(_config(corpus_dir, tokenizer_dir, num_workers=0, prefetch_factor=3), 1, 0)], 4)
    process = _build(_config(corpus_dir, tokenizer_dir, num_workers=1), 1, 0)
    assert all(torch.equal(a, b) for a, b in zip(in_process, _steps([process], 4)))
    process.close()


def test_prefetch_thread_is_ahead_but_state_is_what_was_consumed(corpus_dir, tokenizer_dir):
    import threading
    import time

    before = threading.active_count()
    loader = _build(_config(corpus_dir, tokenizer_dir, prefetch_factor=3), 1, 0)
    batches = iter(loader)
    for _ in range(9):  # step 1 (8 microbatches of 2 rows) and the first microbatch of step 2
        next(batches)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and threading.active_count() == before:
        time.sleep(0.01)
    assert threading.active_count() > before  # the prefetch thread runs, steps ahead
    entries = {k: v for k, v in _decoded(loader.state_dict()).items() if k != HEADER_KEY}
    assert {entry["state"]["rows"] for entry in entries.values()} == {2}  # the end of step 1: R = 2 rows per lane
    loader.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and threading.active_count() > before:
        time.sleep(0.01)
    assert threading.active_count() == before  # close() stops it


def test_an_error_in_the_prefetch_thread_is_its_one_line(corpus_dir, tokenizer_dir, tmp_path):
    from zephon_titan.errors import DataError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n' * 50)
    sources = {"bad": {"paths": [str(bad)]}}
    loader = _build(_config(corpus_dir, tokenizer_dir, sources=sources), 1, 0)
    with pytest.raises(DataError) as caught:
        next(iter(loader))
    assert "bad.jsonl" in str(caught.value) and "not valid JSON" in str(caught.value)
    assert "Traceback" not in str(caught.value)  # not re-raised wrapped in the thread's traceback
    loader.close()


def test_source_names_of_any_printable_characters_round_trip_through_save_and_resume(corpus_dir, tokenizer_dir):
    table = data_table(corpus_dir, tokenizer_dir)
    table["sources"] = {"code/ü v2.0;x": table["sources"]["code"], "prose-[en]": table["sources"]["prose"]}
    config = ZephonDataLoader.Config(data=config_from_dict(table), global_batch_size=16)
    reference = _steps([_build(config, 1, 0)], 4)
    first = _build(config, 2, 0), _build(config, 2, 1)
    _steps(list(first), 2)
    saved = {k: v for loader in first for k, v in loader.state_dict().items()}
    resumed = _build(config, 1, 0)
    resumed.load_state_dict({k: saved[k] for k in resumed.state_dict()})
    assert all(torch.equal(a, b) for a, b in zip(_steps([resumed], 2), reference[2:]))
    assert not torch.equal(reference[2], reference[3])  # control: the comparison tells steps apart


def test_the_loader_warns_at_start_of_exclude_entries_that_match_nothing(corpus_dir, tokenizer_dir, tmp_path):
    import logging

    from torchtitan.tools.logging import logger

    listed = tmp_path / "list.txt"
    listed.write_text("nosuch part-0.parquet 3\n")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        _build(_config(corpus_dir, tokenizer_dir, exclude=str(listed), exclude_from_step=2), 1, 0)
        listed.write_text("")  # control: an empty list names nothing missing
        _build(_config(corpus_dir, tokenizer_dir, exclude=str(listed), exclude_from_step=2), 1, 0)
    finally:
        logger.removeHandler(handler)
    warned = [r.getMessage() for r in records if r.levelno == logging.WARNING and "exclude:" in r.getMessage()]
    assert warned == [
        f"zephon_titan: [dataloader] exclude: 1 of 1 entries of {listed} name no source or single file of this job "
        "and exclude nothing (first: line 1, nosuch part-0.parquet 3); `zephon-titan validate JOB` names every "
        "entry it cannot find"
    ]


def test_a_misspelled_build_argument_is_refused(corpus_dir, tokenizer_dir):
    """The build arguments are TorchTitan's, by name: a misspelled one (a caller of another TorchTitan version)
    is an error, not silently dropped; TorchTitan's snapshot_every_n_steps is accepted."""
    config = _config(corpus_dir, tokenizer_dir)
    kwargs = dict(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ, local_batch_size=2)
    config.build(**kwargs, snapshot_every_n_steps=10).close()
    with pytest.raises(TypeError, match="dp_wrld_size"):
        config.build(**kwargs, dp_wrld_size=2)
