"""Loader state from a checkpoint is untrusted bytes: every change is refused, naming the lane and field."""

import glob

import pytest
import torch
import torch.distributed.checkpoint as dcp
from helpers import data_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_titan.config import config_from_dict
from zephon_titan.engine.resume import HEADER_KEY, lane_key, seal
from zephon_titan.errors import ResumeError
from zephon_titan.loader.state import decode_entry, encode_entry
from zephon_titan.titan.dataloader import ZephonDataLoader

SEQ = 32


def _loader(corpus_dir, tokenizer_dir):
    config = ZephonDataLoader.Config(data=config_from_dict(data_table(corpus_dir, tokenizer_dir)), global_batch_size=16)
    return config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ, local_batch_size=2)


def _batches(loader, n):
    it = iter(loader)
    return [torch.cat([next(it)[0]["input"] for _ in range(8)]) for _ in range(n)]


@pytest.fixture(scope="module")
def saved(corpus_dir, tokenizer_dir):
    """A state after 3 steps, and the 2 steps that follow it."""
    loader = _loader(corpus_dir, tokenizer_dir)
    _batches(loader, 3)
    state = loader.state_dict()
    return state, _batches(loader, 2)


def _edited(state, key, edit, reseal=False):
    out = dict(state)
    entry = decode_entry(state[key], key)
    edit(entry)
    if reseal:  # a writer that knows the format (a bug, another version): the field checks still apply
        header = decode_entry(state[HEADER_KEY], HEADER_KEY)
        entry = seal({k: v for k, v in entry.items() if k != "seal"}, key, "" if key == HEADER_KEY else header["seal"])
    out[key] = encode_entry(entry, state[key].numel())
    return out


def _refused(corpus_dir, tokenizer_dir, state, match):
    with pytest.raises(ResumeError, match=match):
        _loader(corpus_dir, tokenizer_dir).load_state_dict(state)


def test_an_unchanged_state_restores_exactly(corpus_dir, tokenizer_dir, saved):
    state, following = saved
    loader = _loader(corpus_dir, tokenizer_dir)
    loader.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(_batches(loader, 2), following))


@pytest.mark.parametrize("field, value", [("unit_offset", 870), ("rows", 2), ("unit_offset", -1)])
def test_an_edited_field_fails_the_seal(corpus_dir, tokenizer_dir, saved, field, value):
    state = _edited(saved[0], lane_key(3), lambda e: e["state"].__setitem__(field, value))
    _refused(corpus_dir, tokenizer_dir, state, r"dataloader state 'lane_00003' fails its integrity check")


def test_a_lane_copied_to_another_lane_is_refused(corpus_dir, tokenizer_dir, saved):
    state = dict(saved[0])
    entry = decode_entry(state[lane_key(1)], lane_key(1))
    entry["state"]["lane_id"] = 2  # "with its id fixed"
    state[lane_key(2)] = encode_entry(entry, state[lane_key(2)].numel())
    _refused(corpus_dir, tokenizer_dir, state, r"'lane_00002' fails its integrity check.*copied from another lane")


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            lambda e: e["state"]["packer"].__setitem__("unit_offset", -129),
            r"lane 3 .*field 'packer.unit_offset' must be an integer >= 0, got -129",
        ),
        (
            lambda e: e["state"]["packer"].__setitem__("unit_open", ""),
            r"lane 3 .*field 'packer.unit_open' must be true or false, got ''",
        ),
        (
            lambda e: e["state"]["feed"]["cursors"][0].__setitem__(1, -5),
            r"lane 3 .*field 'feed.cursors.position' must be an integer >= 0",
        ),
        (lambda e: e["state"].__setitem__("lane_id", 4), r"lane 3 .*field 'lane_id' is 4, not 3"),
        (lambda e: e.__setitem__("tokens", [1]), r"lane 3 .*field 'tokens' must be 2 counts >= 0"),
        (
            lambda e: e["state"]["feed"]["cursors"].pop(),
            r"lane 3 .*field 'feed.cursors' has 1 sources, the checkpoint has 2",
        ),
        (lambda e: e["state"].__setitem__("rows", 7), r"lanes stand at rows \[6, 7\], not at the end of one step"),
    ],
)
def test_field_types_and_ranges_are_checked_by_name(corpus_dir, tokenizer_dir, saved, edit, match):
    _refused(corpus_dir, tokenizer_dir, _edited(saved[0], lane_key(3), edit, reseal=True), match)


@pytest.mark.parametrize("value", [{}, [], "x", 5])
def test_wrong_shape_entries_are_clean_errors(corpus_dir, tokenizer_dir, saved, value):
    for key in (HEADER_KEY, lane_key(0)):
        state = dict(saved[0])
        state[key] = encode_entry(value, saved[0][key].numel())
        _refused(corpus_dir, tokenizer_dir, state, rf"dataloader state '{key}' is not a sealed zephon_titan entry")


def test_a_header_without_fingerprint_is_refused(corpus_dir, tokenizer_dir, saved):
    state = _edited(saved[0], HEADER_KEY, lambda e: e.pop("fingerprint"), reseal=True)
    _refused(corpus_dir, tokenizer_dir, state, r"'header': field 'fingerprint' must be dict")


def test_one_byte_changed_in_a_real_dcp_file_is_refused(corpus_dir, tokenizer_dir, tmp_path):
    loader = _loader(corpus_dir, tokenizer_dir)
    _batches(loader, 3)
    dcp.save({"dataloader": loader}, checkpoint_id=str(tmp_path))
    (path,) = glob.glob(str(tmp_path / "*.distcp"))
    data = bytearray(open(path, "rb").read())
    at = data.index(b'"unit_offset":') + len(b'"unit_offset":')
    data[at] = ord("9") if data[at] != ord("9") else ord("8")
    open(path, "wb").write(bytes(data))
    fresh = _loader(corpus_dir, tokenizer_dir)
    with pytest.raises(ResumeError, match="fails its integrity check"):
        dcp.load({"dataloader": fresh}, checkpoint_id=str(tmp_path))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lane=st.integers(0, 7), at=st.integers(0, 10_000), byte=st.integers(0, 255))
def test_any_accepted_mutation_leaves_the_batches_unchanged(corpus_dir, tokenizer_dir, saved, lane, at, byte):
    state, following = saved
    key = lane_key(lane)
    raw = bytearray(state[key].numpy().tobytes())
    raw[at % len(raw)] = byte
    mutated = {**state, key: torch.frombuffer(raw, dtype=torch.uint8).clone()}
    loader = _loader(corpus_dir, tokenizer_dir)
    try:
        loader.load_state_dict(mutated)
    except ResumeError:
        return  # refused, naming the entry: fine
    assert all(torch.equal(a, b) for a, b in zip(_batches(loader, 2), following))


def _resealed_header(state, edit):
    """The header edited and resealed, every lane resealed to it: what a writer that knows the format (another
    version, a bug, an adversary) could produce; only the field checks stand between it and the run."""
    header = decode_entry(state[HEADER_KEY], HEADER_KEY)
    edit(header)
    header = seal({k: v for k, v in header.items() if k != "seal"}, HEADER_KEY)
    out = {HEADER_KEY: encode_entry(header, state[HEADER_KEY].numel())}
    for key, value in state.items():
        if key != HEADER_KEY:
            entry = {k: v for k, v in decode_entry(value, key).items() if k != "seal"}
            out[key] = encode_entry(seal(entry, key, header["seal"]), value.numel())
    return out


def _set(name, value):
    return lambda e: e.__setitem__(name, value)


def _fingerprint(name, value):
    return lambda e: e["fingerprint"].__setitem__(name, value)


def _drop_step_and(name, value):
    return lambda e: (e.pop("step"), e.__setitem__(name, value))


@pytest.mark.parametrize(
    "edit, match",
    [
        (_set("step", -1), r"'header': field 'step' must be a step >= 0, got -1"),
        (_set("step", 7), r"lane 0 .*field 'rows' is 6, fewer than the header's 7 steps"),
        (_set("global_batch_size", 0), r"'header': field 'global_batch_size' is 0, not a multiple of its 8 lanes"),
        (_set("global_batch_size", 12), r"field 'global_batch_size' is 12, not a multiple of its 8 lanes"),
        (_set("global_batch_size", -16), r"field 'global_batch_size' is -16, not a multiple"),
        (_drop_step_and("global_batch_size", 7), r"field 'global_batch_size' is 7, not a multiple of its 8 lanes"),
        (_drop_step_and("global_batch_size", 32), r"lanes stand at row 6, not at the end of a step of 4 rows"),
        (_fingerprint("num_lanes", "0"), r"'header': field 'fingerprint' has no num_lanes"),
        (_fingerprint("num_lanes", "\u00b2"), r"field 'fingerprint' has no num_lanes"),
        (_fingerprint("num_lanes", "9" * 5000), r"field 'fingerprint' has no num_lanes"),
        (_set("version", 4), r"format version 4, this zephon_titan reads versions 2, 3"),
    ],
)
def test_every_header_field_is_checked_when_resealed(corpus_dir, tokenizer_dir, saved, edit, match):
    """A negative step, G = 0 or G = 7 without a step were accepted or a ZeroDivisionError traceback."""
    with pytest.raises(ResumeError, match=match) as e:
        _loader(corpus_dir, tokenizer_dir).load_state_dict(_resealed_header(saved[0], edit))
    assert "\n" not in str(e.value)


def test_a_header_resealed_unchanged_loads(corpus_dir, tokenizer_dir, saved):
    # Control for the header checks: resealing alone changes nothing, and the header without `step` (an older
    # checkpoint) gives the same step from its rows.
    state, following = saved
    for edit in (lambda e: None, lambda e: e.pop("step")):
        loader = _loader(corpus_dir, tokenizer_dir)
        loader.load_state_dict(_resealed_header(state, edit))
        assert loader.restored_step == 3
        assert all(torch.equal(a, b) for a, b in zip(_batches(loader, 2), following))


def _cursor(source, field, value):
    return lambda e: e["state"]["feed"]["cursors"][source].__setitem__(
        ("window", "position", "tokens", "offset").index(field), value
    )


def _state(name, value):
    """Set a field of the lane state where its stage keeps it (the packer's, the feed's, or the lane's own)."""
    stage = {"unit_open": "packer", "unit_offset": "packer", "cursors": "feed", "mix": "feed", "replay": "feed"}

    def edit(e):
        (e["state"][stage[name]] if name in stage else e["state"]).__setitem__(name, value)

    return edit


def _closed_with_replay(e):
    e["state"]["packer"].update(unit_open=False, unit_offset=0)
    e["state"]["feed"]["replay"] = [2, [0, 1]]


@pytest.mark.parametrize(
    "edit, match",
    [
        (_cursor(0, "tokens", 10), r"lane 3 .*field 'feed.cursors' of source 0: offset 64 exceeds tokens 10"),
        (_cursor(1, "offset", -1), r"lane 3 .*field 'feed.cursors.offset' must be an integer >= 0, got -1"),
        (_cursor(1, "window", 2**63), r"lane 3 .*field 'feed.cursors.window' must be an integer >= 0"),
        (_state("rows", -6), r"lane 3 .*field 'rows' must be an integer >= 0, got -6"),
        (_state("unit_open", False), r"lane 3 .*field 'packer.unit_offset' is 32 with no open unit"),
        (_state("version", 4), r"lane 3 .*version 4 is not supported"),
        (_state("mix", [1, [65, 0]]), r"lane 3 .*field 'feed.mix.bases' of source 0 is 65, more than the source's 64"),
        (_state("mix", [9, [0, 0]]), r"lane 3 .*field 'feed.mix.segment' is step 9, after the checkpoint's step 3"),
        (_state("mix", [0, [0, 0]]), r"lane 3 .*field 'feed.mix.segment' must be a step >= 1, got 0"),
        (_state("mix", [1, [0]]), r"lane 3 .*field 'feed.mix' must be \[segment, \[one base per source\]\]"),
        (_closed_with_replay, r"lane 3 .*field 'feed.replay' is set with no open unit"),
        (_state("replay", [2, [0, 0]]), r"lane 3 .*field 'feed.replay' must give each of its 2 sources one index"),
        (_state("replay", [2, [0, 2]]), r"lane 3 .*field 'feed.replay' has indices outside \[-1, 2\)"),
        (
            _state("replay", [1, [0, -1]]),
            r"lane 3 .*field 'feed.cursors' of source 1: a source added after the open unit",
        ),
        (_set("tokens", [96, -1]), r"lane 3 .*field 'tokens' must be 2 counts >= 0"),
        (_set("padding", -1), r"lane 3 .*field 'padding' must be 1 counts >= 0"),
        (_set("padding", True), r"lane 3 .*field 'padding' must be 1 counts >= 0"),
    ],
)
def test_every_lane_field_is_checked_for_range_and_consistency(corpus_dir, tokenizer_dir, saved, edit, match):
    with pytest.raises(ResumeError, match=match) as e:
        _loader(corpus_dir, tokenizer_dir).load_state_dict(_edited(saved[0], lane_key(3), edit, reseal=True))
    assert "\n" not in str(e.value)


def test_consistent_mix_and_replay_fields_load(corpus_dir, tokenizer_dir, saved):
    # Control for the consistency checks: the same fields with consistent values are accepted.
    for edit in (_state("mix", [1, [64, 96]]), _state("replay", [2, [1, 0]]), _state("replay", [2, [0, 1]])):
        _loader(corpus_dir, tokenizer_dir).load_state_dict(_edited(saved[0], lane_key(3), edit, reseal=True))


def test_a_cursor_beyond_its_window_is_refused_not_skipped(corpus_dir, tokenizer_dir, saved):
    """A resealed position past the end of its window would silently skip the window's other documents."""
    state, following = saved

    def far(entry):
        cursors = entry["state"]["feed"]["cursors"]
        cursors[0][1] = 10**6

    loader = _loader(corpus_dir, tokenizer_dir)
    loader.load_state_dict(_edited(state, lane_key(0), far, reseal=True))
    with pytest.raises(ResumeError, match=r"lane 0, source 'code': the restored cursor stands at document 1000000"):
        _batches(loader, 2)
    # Control: a position at its window's end (a finished window) is what a run writes; the unchanged
    # state restores exactly (test_an_unchanged_state_restores_exactly).
