"""The fingerprint: everything lane purity depends on, as named components.

A resume compares the saved components with the current ones and names each that
changed (data, tokenizer, seed, seq_len, num_lanes, ...). The number of ranks,
workers and the batch split are deliberately absent: changing them is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from fractions import Fraction

from zephon_titan.engine.mixing import initial_offsets
from zephon_titan.engine.packing import packer_class
from zephon_titan.engine.pipeline import PipelineEra, era_pipelines, read_eras, slots_needed
from zephon_titan.engine.pipeline import eras_text as pipeline_eras_text
from zephon_titan.engine.schedule import Phase, Schedule
from zephon_titan.engine.seq_len_schedule import Era
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import STATE_VERSION, refuse_removed_sources
from zephon_titan.engine.transforms import describe_all
from zephon_titan.errors import ResumeError

# A fingerprint: component name -> value. `sources` is the list of source names (a name may hold any character
# the config allows); every other component is one string.
Fingerprint = dict[str, str | list[str]]


def source_names(fp: Fingerprint) -> list[str]:
    """The source names of a fingerprint (its `sources` list)."""
    names = fp.get("sources", [])
    assert isinstance(names, list), "Header.from_entry converts older fingerprints"
    return names


def component_text(value: str | list[str] | None) -> str:
    """A component as one line: a list (the sources) as its names."""
    if value is None:
        return "<absent>"
    return ", ".join(value) if isinstance(value, list) else value


def fingerprint(spec: EngineSpec) -> Fingerprint:
    """Every component lane purity depends on. Each source format contributes its own components (Source.
    fingerprint: files, layout, locations, mtimes), as each packer its settings (Packer.fingerprint)."""
    c = spec.config
    return {
        "state_version": str(STATE_VERSION),
        "sources": list(spec.source_names),
        **{f"{kind}.{source.name}": value for source in spec.sources for kind, value in source.fingerprint().items()},
        **_mixture_component(spec),
        "tokenizer": spec.tokenizer.digest()[:16],
        "seed": str(c.seed),
        "seq_len": str(spec.seq_len),
        "num_lanes": str(c.num_lanes),
        "packing": packer_class(c.packing).fingerprint(c),
        "labels": c.labels,
        "mix_chunk_tokens": str(spec.mix_chunk_tokens),
        **({"mix_by": c.mix_by} if c.mix_by != "tokens" else {}),
        "shuffle": "on" if c.shuffle else "off",
        "exhaustion": c.exhaustion,
        "shuffle_window_blocks": str(c.shuffle_window_blocks),
        **_split_component(spec),
        **{f"pipeline.{s.name}": s.pipeline.describe() for s in spec.sources if s.pipeline is not None},
        **_pipelines_component(spec),
        **{f"transform.{s.name}": describe_all(s.transforms) for s in spec.sources if s.transforms},
        **{f"chat.{s.name}": s.chat.describe() for s in spec.sources if s.chat is not None},
        **_mixing_components(spec),
        **({SEQ_LENS_KEY: eras_text(spec.eras)} if spec.eras else {}),
        **({EXCLUDE_KEY: spec.exclusion.describe()} if spec.exclusion is not None else {}),
    }


# Every source's keep and repeat by step, and its windows' slots per document (engine/pipeline.py), present only
# when some step has a keep or a repeat. A resume may change them only from a step after the checkpoint's.
PIPELINES_KEY = "pipelines"


def check_pipelines(
    saved: Fingerprint, current: Fingerprint, step: int
) -> tuple[tuple[PipelineEra, ...], dict[str, int], str]:
    """The pipelines of a run resumed after `step` steps: the checkpoint's eras up to that step, then this config's
    from a later step (like an exclusion, only what is not trained yet may change), and each source's slots per
    document as the checkpoint's windows have them. ResumeError for a change at or before `step`, or a repeat that
    needs more slots; also returns a line describing the change ("" if none)."""
    old, new = saved.get(PIPELINES_KEY), current.get(PIPELINES_KEY)
    old_eras, old_slots = read_eras(old) if isinstance(old, str) else ((PipelineEra(1, {}),), {})
    new_eras, new_slots = read_eras(new) if isinstance(new, str) else ((PipelineEra(1, {}, _transforms(current)),), {})
    if not any(e.transforms for e in old_eras):  # written before eras held transforms: the checkpoint's throughout
        old_eras = tuple(dataclasses.replace(e, transforms=_transforms(saved)) for e in old_eras)
    done = tuple(e for e in old_eras if e.start <= step) or old_eras[:1]
    # The config's own era is its pipelines from pipeline_from_step; what a new run would have before it (none)
    # is, at a resume, the checkpoint's.
    config_era = new_eras[-1]
    ahead = (config_era,) if config_era.start > step else ()
    if config_era.start <= step and not config_era.same_pipelines(done[-1]):
        raise ResumeError(
            f"keep, repeat, transform or chat template of source {', '.join(config_era.changed_sources(done[-1]))} "
            f"changed, but the config puts the change at or before the checkpoint's step {step} (those steps are "
            f"trained already); set [dataloader] pipeline_from_step = {step + 1} (or later) to change them from there "
            "on, or restore them"
        )
    if ahead and ahead[0].same_pipelines(done[-1]):
        ahead = ahead[1:]  # no change at its start
    slots = {**new_slots, **old_slots}
    for era in ahead:
        for name in era.expressions:
            needed = slots_needed(era_pipelines(name, [era]))
            have = old_slots.get(name, 1) if name in saved.get("sources", []) else slots.get(name, needed)
            if needed > have:
                raise ResumeError(
                    f"[dataloader.sources.{name}] repeat from step {era.start} can train a document {needed} times "
                    f"a pass, but the run's windows have room for {have} (its repeat's bound when the run began); "
                    f"keep the bound at {have} or below, e.g. min(..., {have})"
                )
    change = ""
    if ahead:
        changed = sorted({n for e in ahead for n in e.changed_sources(done[-1])})
        same = all((e.transforms, e.chats) == (done[-1].transforms, done[-1].chats) for e in ahead)
        what = "keep and repeat" if same else "the pipelines"
        change = f"{what} of {', '.join(changed)} change from step {ahead[0].start}"
    return done + ahead, slots, change


def _transforms(fp: Fingerprint) -> dict[str, str]:
    """Each source's transforms as a fingerprint names them (`transform.<source>`)."""
    return {key.split(".", 1)[1]: str(v) for key, v in fp.items() if key.startswith("transform.")}


def _pipelines_component(spec: EngineSpec) -> Fingerprint:
    if not any(e.expressions or e.chats for e in spec.pipeline_eras) and not spec.transforms_change:
        return {}
    slots = {s.name: s.slots for s in spec.sources if any(p is not None for p in s.era_pipelines)}
    return {PIPELINES_KEY: pipeline_eras_text(spec.pipeline_eras, slots)}


# The documents skipped from a step on (engine/exclusion.py), present only with `[dataloader] exclude`: its first
# step and the list's digest. A resume may set or change it only where it changes no step already trained.
EXCLUDE_KEY = "exclude"


def _exclude_from(value: str | list[str] | None) -> int | None:
    match = re.match(r"from step (\d+),", value) if isinstance(value, str) else None
    return int(match.group(1)) if match else None


def check_exclusion(saved: Fingerprint, current: Fingerprint, step: int) -> str:
    """Compare the exclusion of the checkpoint (saved after `step` steps) with this run's: like a mixture phase,
    only steps after `step` may change (ResumeError otherwise). Returns a line describing the change ("" if
    none)."""
    old, new = saved.get(EXCLUDE_KEY), current.get(EXCLUDE_KEY)
    if old == new:
        return ""
    old_from, new_from = _exclude_from(old), _exclude_from(new)
    if old_from is not None and old_from <= step:
        raise ResumeError(
            f"[dataloader] exclude changed ({component_text(old)} -> {component_text(new)}), but the checkpoint's "
            f"exclusion is in force since step {old_from}, at or before its step {step}; keep the run's exclude and "
            "exclude_from_step"
        )
    if new_from is not None and new_from <= step:
        raise ResumeError(
            f"[dataloader] exclude_from_step = {new_from} is at or before the checkpoint's step {step} (those steps "
            f"are trained already); set exclude_from_step to {step + 1} or later"
        )
    if new is None:
        return f"the exclusion planned from step {old_from} is dropped (it had not begun)"
    return f"documents are excluded {component_text(new)}"


# The run's row lengths by step (EngineSpec.eras), present only when they change: a job that schedules seq_len, or
# a resume that changed it (checkpoints of a schedule written before this record have none: saved_eras). A reader
# that knows it not refuses such a checkpoint by naming it.
SEQ_LENS_KEY = "seq_lens"


def eras_text(eras: tuple[Era, ...]) -> str:
    return json.dumps([[e.start, e.seq_len, e.chunk] for e in eras], separators=(",", ":"))


def saved_eras(fp: Fingerprint, step: int, current: Fingerprint) -> tuple[Era, ...]:
    """A checkpoint's row lengths by step (at least one era), saved after `step` steps: from its record, or without
    one from its seq_len and mix_chunk_tokens; `current` (this run's fingerprint) tells a checkpoint whose job
    scheduled seq_len before the record existed. ResumeError if the record is damaged or cannot be known."""
    eras = recorded_eras(fp)
    if SEQ_LENS_KEY in fp and not any(phase.seq_len for phase in _mixture_of(fp).phases):
        # Without a schedule of its own the record holds only its resumes' changes, the last its seq_len.
        last = eras[-1]
        if last.start > step + 1 or (str(last.seq_len), str(last.chunk)) != (fp["seq_len"], fp["mix_chunk_tokens"]):
            raise ResumeError(
                f"the checkpoint's fingerprint field {SEQ_LENS_KEY!r} is damaged (without a seq_len schedule its "
                f"eras end with its seq_len, by step {step + 1})"
            )
    if SEQ_LENS_KEY in fp or SEQ_LENS_KEY not in current:
        return eras
    # A job that schedules seq_len, saved before the record: its schedule up to the checkpoint is this job's
    # (check_mixture refuses a change of the past), with the row length and piece size its phases inherit.
    if (fp.get("seq_len"), fp.get("mix_chunk_tokens")) != (current.get("seq_len"), current.get("mix_chunk_tokens")):
        raise ResumeError(
            "the job schedules seq_len ([[dataloader.phases]] seq_len) and its checkpoint was written before "
            "checkpoints recorded the schedule, so the row lengths it inherited from [training] seq_len "
            f"({fp.get('seq_len')}) are not known; resume with [training] seq_len = {fp.get('seq_len')} and "
            f"mix_chunk_tokens as then, and change them at a later resume (its checkpoint records them)"
        )
    return recorded_eras(current)


def recorded_eras(fp: Fingerprint) -> tuple[Era, ...]:
    """The row lengths by step a fingerprint records (at least one era). ResumeError if the record is damaged."""
    try:
        return _eras_of(fp)
    except (ValueError, TypeError) as e:
        raise ResumeError(f"the checkpoint's fingerprint field {SEQ_LENS_KEY!r} is damaged ({e})") from None


def _eras_of(fp: Fingerprint) -> tuple[Era, ...]:
    seq_len, chunk = int(str(fp.get("seq_len"))), int(str(fp.get("mix_chunk_tokens")))
    record = fp.get(SEQ_LENS_KEY)
    if record is None:
        return (Era(1, seq_len, chunk),)
    eras = tuple(Era(*(int(v) for v in e)) for e in json.loads(str(record)))
    starts = [e.start for e in eras]
    if len(eras) < 2 or starts[0] != 1 or starts != sorted(set(starts)):
        raise ValueError("eras must be two or more, from step 1 at ascending steps")
    if min(min(e.seq_len, e.chunk) for e in eras) < 1:
        raise ValueError("every era's seq_len and mix_chunk_tokens must be >= 1")
    return eras


def seq_len_checked_apart(saved: Fingerprint, current: Fingerprint) -> Fingerprint:
    """`current` as check_fingerprint compares it at a resume: a new seq_len is a change of the future only (the
    lanes go on where they stopped: EngineSpec.eras), and mix_chunk_tokens may change with it (it follows seq_len
    unless set); the checkpoint's record of earlier seq_lens is kept."""
    out = dict(current)
    for key in (
        SEQ_LENS_KEY,
        *(["seq_len", "mix_chunk_tokens"] if saved.get("seq_len") != current.get("seq_len") else []),
    ):
        if key in saved:
            out[key] = saved[key]
        else:
            out.pop(key, None)
    return out


# How a run mixes, beyond its weights: each component present only when it differs from what runs before
# issue 29 did, so their fingerprints (and checkpoints) stay as they were, and a resume reads its absence so.
PHASES_KEY = "mix_phases"  # mixing offsets kept across added sources (mixing.py), when not s / S
BEST_FIT_KEY = "best_fit_mixing"  # packing.py's BestFitPacker, when "per_step"


def _mixing_components(spec: EngineSpec) -> dict[str, str]:
    return mixing_components(
        spec.source_names, spec.phase_offsets, spec.config.packing == "best_fit", spec.config.best_fit_mixing
    )


def mixing_components(
    names: list[str], offsets: tuple[Fraction, ...] | None, best_fit: bool, best_fit_mixing: str
) -> dict[str, str]:
    out = {}
    if offsets is not None and tuple(offsets) != initial_offsets(len(names)):
        out[PHASES_KEY] = json.dumps({n: str(u) for n, u in zip(names, offsets)}, separators=(",", ":"))
    if best_fit and best_fit_mixing != "per_window":
        out[BEST_FIT_KEY] = best_fit_mixing
    return out


def saved_mixing(fp: Fingerprint) -> tuple[dict[str, Fraction], str]:
    """How a checkpoint's run mixed: each source's mixing offset (s / S without a record) and its best_fit_mixing
    ("per_window" without one: written before it existed). ResumeError if the record is damaged."""
    names = source_names(fp)
    record = fp.get(PHASES_KEY)
    mixing = fp.get(BEST_FIT_KEY, "per_window")
    if record is None:
        return dict(zip(names, initial_offsets(len(names)))), str(mixing)
    try:
        offsets = {name: Fraction(text) for name, text in json.loads(str(record)).items()}
        if sorted(offsets) != sorted(names) or not all(0 <= u < 1 for u in offsets.values()):
            raise ValueError("not one offset in [0, 1) per source")
    except (ValueError, TypeError, ZeroDivisionError, AttributeError) as e:
        raise ResumeError(f"the checkpoint's fingerprint field {PHASES_KEY!r} is damaged ({e})") from None
    return offsets, str(mixing)


def as_resumed(current: Fingerprint, offsets: dict[str, Fraction], best_fit_mixing: str) -> Fingerprint:
    """This run's fingerprint once it adopts the checkpoint's mixing (EngineSpec.resumed)."""
    names = source_names(current)
    best_fit = str(current.get("packing", "")).startswith("best_fit(")
    out = {k: v for k, v in current.items() if k not in (PHASES_KEY, BEST_FIT_KEY)}
    return out | mixing_components(names, tuple(offsets[n] for n in names), best_fit, best_fit_mixing)


# The mixture: `weights` for a run without phases (as before schedules existed), else `schedule`.
MIXTURE_KEYS = ("weights", "schedule")


def _mixture_component(spec: EngineSpec) -> dict[str, str]:
    if spec.schedule.phased:
        return {"schedule": spec.schedule.describe()}
    return {"weights": ",".join(f"{w:.12g}" for w in spec.weights)}


def _mixture_of(fp: Fingerprint) -> Schedule:
    """The schedule a fingerprint describes (a weights-only fingerprint: one phase from step 1)."""
    described, weights = fp.get("schedule"), fp.get("weights", "")
    if isinstance(described, str):
        return Schedule.from_description(described)
    assert isinstance(weights, str)
    return Schedule(source_names(fp), [Phase(1, tuple(float(w) for w in weights.split(",")))])


def check_mixture(saved: Fingerprint, current: Fingerprint, step: int) -> str:
    """Compare the mixture of the checkpoint (saved after `step` steps) with this run's: a change at or
    before `step` would change data already trained on (ResumeError naming the first such step); a
    change after it is allowed. Returns a line describing the allowed change ("" if none)."""
    if all(saved.get(k) == current.get(k) for k in MIXTURE_KEYS):
        return ""
    old, new = _mixture_of(saved), _mixture_of(current)
    first = old.first_difference(new, step)
    if first is not None:
        raise ResumeError(
            f"the mixture schedule changed at step {first}, at or before the checkpoint's step {step}: weights "
            f"{_weights(old, first)} -> {_weights(new, first)}. A resume may change the schedule only after the "
            "checkpoint's step; restore the weights of the steps already trained"
        )
    later = old.first_difference(new, 1 << 62)
    return (
        f"the mixture schedule changes after the checkpoint's step {step}: from step {later} the weights are "
        f"{_weights(new, later)} (were {_weights(old, later)})"
        if later is not None
        else ""
    )


def _weights(schedule: Schedule, step: int) -> str:
    weights = ", ".join(f"{name} {w:g}" for name, w in schedule.weights_by_name(step).items()) or "none"
    seq_len = schedule.seq_len_at(step)
    return weights + (f" at seq_len {seq_len}" if seq_len else "")


def _split_component(spec: EngineSpec) -> dict[str, str]:
    """The train/eval split (engine/split.py), present only when some source holds documents out,
    so checkpoints of runs without a split keep their fingerprint."""
    held = [f"{s.name} {s.eval_fraction:.12g}" for s in spec.config.sources if s.eval_fraction > 0]
    if not held:
        return {}
    return {"split": f"{spec.config.split} part, split_seed {spec.config.split_seed}, eval_fraction " + ", ".join(held)}


def _added_sources(saved: Fingerprint, current: Fingerprint) -> set[str]:
    """The components a resume that only adds sources changes (the source list, the new sources' files):
    allowed, since check_mixture makes sure no added source had a weight at a step already trained."""
    old, new = source_names(saved), source_names(current)
    added = [name for name in new if name not in old]
    if not added or any(name not in new for name in old):
        return set()
    return {"sources"} | {f"{kind}.{name}" for name in added for kind in ("files", "layout", "locations", "mtimes")}


def check_fingerprint(
    saved: Fingerprint,
    current: Fingerprint,
    allow: list[str] | tuple[str, ...] = (),
    mixture_checked_apart: bool = False,
) -> None:
    """Raise ResumeError listing every component that differs (old -> new), except the kinds in `allow`
    (and the mixture and exclusion when `mixture_checked_apart`: check_mixture() and check_exclusion() know the
    checkpoint's step)."""
    # At a resume the mixing offsets are the checkpoint's and the added sources' (resume.read_state).
    apart = {
        *MIXTURE_KEYS,
        PHASES_KEY,
        EXCLUDE_KEY,
        PIPELINES_KEY,
        "pipeline",
        "transform",
        "chat",
    }  # check_mixture & co. at a resume (check_pipelines: keep, repeat, transforms and chat templates by step)
    skip = set(allow) | (apart if mixture_checked_apart else set())
    if mixture_checked_apart:  # a resume: sources may be added, not removed
        refuse_removed_sources(source_names(saved), source_names(current))
    skip_keys = _added_sources(saved, current) if mixture_checked_apart else set()
    changed = [
        f"{key}: {component_text(saved.get(key))} -> {component_text(current.get(key))}"
        for key in sorted(set(saved) | set(current))
        if saved.get(key) != current.get(key) and key.split(".")[0] not in skip and key not in skip_keys
    ]
    if changed:
        raise ResumeError(
            "the checkpoint's data stream differs from this run's config, so resuming would change "
            "the data; changed: "
            + "; ".join(changed)
            + ". Restore the old settings, or start a new run (without the checkpoint's dataloader state). "
            "If the same data was only copied or moved, set [dataloader] resume_allow to the kinds that changed: "
            '"mtimes" (new modification times), "locations" (another directory, bucket or prefix)'
        )
