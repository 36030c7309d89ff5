"""The fingerprint: everything lane purity depends on, as named components.

A resume compares the saved components with the current ones and names each that
changed (data, tokenizer, seed, seq_len, num_lanes, ...). The number of ranks,
workers and the batch split are deliberately absent: changing them is allowed.
"""

from __future__ import annotations

import hashlib
import json
import posixpath

from zephon_titan.engine.packing import packer_class
from zephon_titan.engine.schedule import Phase, Schedule
from zephon_titan.engine.spec import EngineSpec
from zephon_titan.engine.state import STATE_VERSION, refuse_removed_sources
from zephon_titan.errors import ResumeError


def _sha(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def _source_components(spec: EngineSpec) -> dict[str, str]:
    out = {}
    for source in spec.sources:
        d = source.describe()
        files = d["files"]  # [path, size, mtime_ns, blocks] per file
        out[f"files.{source.name}"] = (
            f"{len(files)} files, {sum(f[1] for f in files):,} bytes, {source.num_blocks} blocks"
        )
        layout = {k: v for k, v in d.items() if k != "files"}
        # A file's name (and its order, size, blocks) is layout; the directory or bucket it is read
        # from is its location, so data moved elsewhere can be allowed without allowing other changes.
        where = [posixpath.split(f[0]) for f in files]
        out[f"layout.{source.name}"] = _sha([layout, [[name, f[1], f[3]] for (_, name), f in zip(where, files)]])
        out[f"locations.{source.name}"] = _sha([directory for directory, _ in where])
        out[f"mtimes.{source.name}"] = _sha([f[2] for f in files])
    return out


def fingerprint(spec: EngineSpec) -> dict[str, str]:
    c = spec.config
    return {
        "state_version": str(STATE_VERSION),
        "sources": ",".join(spec.source_names),
        **_source_components(spec),
        **_mixture_component(spec),
        "tokenizer": spec.tokenizer.digest()[:16],
        "seed": str(c.seed),
        "seq_len": str(spec.seq_len),
        "num_lanes": str(c.num_lanes),
        "packing": packer_class(c.packing).fingerprint(c),
        "labels": c.labels,
        "mix_chunk_tokens": str(spec.mix_chunk_tokens),
        "shuffle": "on" if c.shuffle else "off",
        "exhaustion": c.exhaustion,
        "shuffle_window_blocks": str(c.shuffle_window_blocks),
        **_split_component(spec),
    }


# The mixture: `weights` for a run without phases (as before schedules existed), else `schedule`.
MIXTURE_KEYS = ("weights", "schedule")


def _mixture_component(spec: EngineSpec) -> dict[str, str]:
    if spec.schedule.scheduled:
        return {"schedule": spec.schedule.describe()}
    return {"weights": ",".join(f"{w:.12g}" for w in spec.weights)}


def _mixture_of(fp: dict[str, str]) -> Schedule:
    """The schedule a fingerprint describes (a weights-only fingerprint: one phase from step 1)."""
    if "schedule" in fp:
        return Schedule.from_description(fp["schedule"])
    names = fp.get("sources", "").split(",")
    return Schedule(names, [Phase(1, tuple(float(w) for w in fp.get("weights", "").split(",")))])


def check_mixture(saved: dict[str, str], current: dict[str, str], step: int) -> str:
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
    return ", ".join(f"{name} {w:g}" for name, w in schedule.weights_by_name(step).items()) or "none"


def _split_component(spec: EngineSpec) -> dict[str, str]:
    """The train/eval split (engine/split.py), present only when some source holds documents out,
    so checkpoints of runs without a split keep their fingerprint."""
    held = [f"{s.name} {s.eval_fraction:.12g}" for s in spec.config.sources if s.eval_fraction > 0]
    if not held:
        return {}
    return {"split": f"{spec.config.split} part, split_seed {spec.config.split_seed}, eval_fraction " + ", ".join(held)}


def _added_sources(saved: dict[str, str], current: dict[str, str]) -> set[str]:
    """The components a resume that only adds sources changes (the source list, the new sources' files):
    allowed, since check_mixture makes sure no added source had a weight at a step already trained."""
    old, new = saved.get("sources", "").split(","), current.get("sources", "").split(",")
    added = [name for name in new if name not in old]
    if not added or any(name not in new for name in old):
        return set()
    return {"sources"} | {f"{kind}.{name}" for name in added for kind in ("files", "layout", "locations", "mtimes")}


def check_fingerprint(
    saved: dict[str, str],
    current: dict[str, str],
    allow: list[str] | tuple[str, ...] = (),
    mixture_checked_apart: bool = False,
) -> None:
    """Raise ResumeError listing every component that differs (old -> new), except the kinds in `allow`
    (and the mixture when `mixture_checked_apart`: check_mixture() knows the checkpoint's step)."""
    skip = set(allow) | (set(MIXTURE_KEYS) if mixture_checked_apart else set())
    if mixture_checked_apart:  # a resume: sources may be added, not removed
        refuse_removed_sources(saved.get("sources", "").split(","), current.get("sources", "").split(","))
    skip_keys = _added_sources(saved, current) if mixture_checked_apart else set()
    changed = [
        f"{key}: {saved.get(key, '<absent>')} -> {current.get(key, '<absent>')}"
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
