"""The row-length schedule: the seq_len (and mixer piece size) in force at each step, as eras.

A job's phases set its eras (`[[dataloader.phases]] seq_len`: seq_len_eras); a resume keeps its checkpoint's eras
up to its step and appends its config's (eras_after). It stands apart from EngineSpec, which holds a run's eras,
because a checkpoint's eras are read and compared (fingerprint.py, resume.py) without a spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon_titan.config import DataConfig
from zephon_titan.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Era:
    """Steps from `start` on have rows of `seq_len` and the mixer takes pieces of at most `chunk` tokens."""

    start: int
    seq_len: int
    chunk: int


def era_at(eras: tuple[Era, ...], step: int) -> Era:
    """The era in force at `step` (before the first one's start: the first)."""
    return [e for e in eras if e.start <= step][-1] if step >= eras[0].start else eras[0]


def eras_after(saved: tuple[Era, ...], step: int, planned: tuple[Era, ...]) -> tuple[Era, ...]:
    """A run's eras (`saved`: its checkpoint's, one at least) resumed after `step` steps by a config whose own eras
    are `planned` (one at least): the eras that began by step `step` (one that would begin at step + 1 was never
    trained), then the planned era in force at step + 1 from there if it differs, then the later planned ones.
    Empty: one era."""
    kept = [e for e in saved if e.start <= step] or [saved[0]]
    now = era_at(planned, step + 1)
    if (kept[-1].seq_len, kept[-1].chunk) != (now.seq_len, now.chunk):
        kept.append(Era(step + 1, now.seq_len, now.chunk))
    kept += [e for e in planned if e.start > step + 1]
    return tuple(kept) if len(kept) > 1 else ()


def seq_len_eras(config: DataConfig, seq_len: int) -> tuple[Era, ...]:
    """The eras of the phases' seq_len (the first phase's default: `seq_len`); empty: `seq_len` throughout."""
    eras = [Era(1, seq_len, config.mix_chunk_tokens or seq_len)]
    for i, phase in enumerate(config.phases):
        if phase.seq_len > seq_len:
            raise ConfigError(
                f"[[dataloader.phases]] #{i + 1} (start_step {phase.start_step}) seq_len = {phase.seq_len} is above "
                f"[training] seq_len = {seq_len}; set [training] seq_len to the schedule's longest (TorchTitan sizes "
                "the model's RoPE cache by it)"
            )
        if phase.seq_len and phase.seq_len != eras[-1].seq_len:
            era = Era(phase.start_step, phase.seq_len, config.mix_chunk_tokens or phase.seq_len)
            eras[-1:] = [era] if eras[-1].start == phase.start_step else [eras[-1], era]
    return tuple(eras) if eras != [Era(1, seq_len, config.mix_chunk_tokens or seq_len)] else ()
