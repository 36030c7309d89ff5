"""TorchTitan's rules that `Job` (titan/job.py) answers before the trainer exists, each compared with TorchTitan's
own behaviour on a grid, and each comparison shown able to fail (a deliberately wrong derivation is caught):

- the data-parallel size: Job.dp_world_size calls TorchTitan's ParallelDims (no mesh, no process group); pinned
  against ParallelDims.from_config's dp_replicate x dp_shard, and its refusals;
- the loader's rows per microbatch: TorchTitan computes it inline in Trainer.__init__ (`dataloader_batch_size`,
  passed to `config.dataloader.build(local_batch_size=)`); that expression, taken from the trainer's own source,
  is evaluated on a grid of configs and compared with Job.local_batch_size;
- the checkpoint whose loader state a resume restores: TorchTitan's CheckpointManager.load, on a manager built
  without a model or process group (dcp_load replaced by a recorder), compared with Job.checkpoint_to_resume.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import os
import textwrap
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from torchtitan.components.checkpoint import DATALOADER, CheckpointManager
from torchtitan.config.configs import ParallelismConfig, TrainingConfig
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.trainer import Trainer

from zephon_titan.errors import ConfigError
from zephon_titan.titan.job import Job

REFUSED = "refused"


def _job(**config: Any) -> Job:
    return Job("job.toml", SimpleNamespace(**config))  # type: ignore[arg-type]


# --- data-parallel size -------------------------------------------------------------------------------------------

DEGREES = list(
    itertools.product(
        (1, 2, 3, 4, 6, 8, 12, 16),  # world size
        (1, 2, 3),  # dp_replicate
        (-1, 1, 2, 4),  # dp_shard
        (1, 2),  # cp
        (1, 2),  # tp
        (1, 2),  # pp
    )
)


def _parallelism(replicate: int, shard: int, cp: int, tp: int, pp: int) -> ParallelismConfig:
    return ParallelismConfig(
        data_parallel_replicate_degree=replicate,
        data_parallel_shard_degree=shard,
        context_parallel_degree=cp,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=pp,
    )


def _titan_dp(parallelism: ParallelismConfig, world: int) -> int | str:
    try:
        dims = ParallelDims.from_config(parallelism, world)
    except AssertionError:
        return REFUSED
    return dims.dp_replicate * dims.dp_shard


def _ours_dp(parallelism: ParallelismConfig, world: int) -> int | str:
    try:
        return _job(parallelism=parallelism).dp_world_size(world)
    except ConfigError:
        return REFUSED


def _wrong_dp(parallelism: ParallelismConfig, world: int) -> int | str:
    """A plausible mistake: dp_shard = -1 taking the rest of the world without dividing out context parallelism."""
    p = parallelism
    shard = p.data_parallel_shard_degree
    if shard < 0:
        shard = world // (p.data_parallel_replicate_degree * p.tensor_parallel_degree * p.pipeline_parallel_degree)
    return p.data_parallel_replicate_degree * shard


def _dp_mismatches(derive: Callable[[ParallelismConfig, int], int | str]) -> list[tuple]:
    out = []
    for world, *degrees in DEGREES:
        p = _parallelism(*degrees)
        if (theirs := _titan_dp(p, world)) != (ours := derive(p, world)):
            out.append((world, *degrees, theirs, ours))
    return out


def test_the_data_parallel_size_is_torchtitans():
    assert not _dp_mismatches(_ours_dp)
    answers = {_titan_dp(_parallelism(*d), w) for w, *d in DEGREES}
    assert REFUSED in answers and len(answers) > 4  # the grid holds refusals and several sizes


def test_a_wrong_data_parallel_size_is_caught():
    assert _dp_mismatches(_wrong_dp)


def test_degrees_that_do_not_fit_are_named():
    with pytest.raises(ConfigError, match=r"degrees do not fit 6 processes: data_parallel_replicate_degree 4 x"):
        _job(parallelism=_parallelism(4, -1, 1, 1, 1)).dp_world_size(6)


# --- rows per microbatch (the loader's local_batch_size) ---------------------------------------------------------


def _trainer_expression() -> ast.expr:
    """The value TorchTitan's Trainer.__init__ passes to config.dataloader.build(local_batch_size=)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(Trainer.__init__)))
    passed = [
        kw.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "config.dataloader.build"
        for kw in node.keywords
        if kw.arg == "local_batch_size"
    ]
    assert len(passed) == 1, "TorchTitan's trainer no longer builds its loader with local_batch_size="
    value = passed[0]
    if isinstance(value, ast.Name):  # a local: its one assignment
        assigned = [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [value.id]
        ]
        assert len(assigned) == 1, f"{value.id} is assigned {len(assigned)} times in Trainer.__init__"
        value = assigned[0]
    return value


BATCHES = list(itertools.product((1, 2, 4, 8), (1, 2, 4), (1, 2, 4)))  # local batch, pp degree, pp microbatch


def _batch_mismatches(derive: Callable[[Job], int]) -> list[tuple]:
    code = compile(ast.Expression(_trainer_expression()), "<torchtitan Trainer.__init__>", "eval")
    out = []
    for local, pp, micro in BATCHES:
        config = SimpleNamespace(
            training=TrainingConfig(local_batch_size=local, global_batch_size=64),
            parallelism=ParallelismConfig(pipeline_parallel_degree=pp, pipeline_parallel_microbatch_size=micro),
        )
        parallel_dims = ParallelDims.from_config(config.parallelism, pp)
        theirs = eval(code, {}, {"config": config, "parallel_dims": parallel_dims})
        if theirs != (ours := derive(_job(**vars(config)))):
            out.append((local, pp, micro, theirs, ours))
    return out


def test_the_loaders_rows_per_microbatch_are_the_trainers():
    assert not _batch_mismatches(lambda job: job.local_batch_size)


def test_a_wrong_microbatch_rule_is_caught():
    assert _batch_mismatches(lambda job: job.config.training.local_batch_size)  # PP ignored


# --- the checkpoint a resume restores ----------------------------------------------------------------------------


def _make(root: str, layout: dict[str, tuple[str, ...]]) -> None:
    for folder, files in layout.items():
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        for name in files:
            open(os.path.join(root, folder, name), "w").close()


def _titan_resume(dump: str, checkpoint: CheckpointManager.Config) -> str | None:
    """The folder TorchTitan's CheckpointManager.load restores the loader from; REFUSED where it raises."""
    manager = CheckpointManager(
        checkpoint,
        dataloader=None,
        model_parts=[],
        optimizers=None,  # type: ignore[arg-type]
        lr_schedulers=None,  # type: ignore[arg-type]
        states={},
        sd_adapter=None,
        base_folder=dump,
    )
    loaded: list[tuple[str, dict]] = []
    manager.dcp_load = lambda states, checkpoint_id, **_: loaded.append((checkpoint_id, states))  # type: ignore
    try:
        if not manager.load(step=checkpoint.load_step):
            return None
    except (FileNotFoundError, ValueError):
        # Excluding the loader, a refusal is TorchTitan's to report at load: no loader state is read (Job says None).
        return None if DATALOADER in checkpoint.exclude_from_loading else REFUSED
    finally:
        manager.close()
    ((checkpoint_id, states),) = loaded
    return checkpoint_id if DATALOADER in states else None


def _ours_resume(dump: str, checkpoint: CheckpointManager.Config) -> str | None:
    folder = _job(dump_folder=dump, checkpoint=checkpoint).checkpoint_to_resume()
    return REFUSED if folder is not None and not os.path.isdir(folder) else folder  # train.check_resume refuses


def _wrong_resume(dump: str, checkpoint: CheckpointManager.Config) -> str | None:
    """A plausible mistake: the latest step-N folder by name, whether or not its save finished (.metadata)."""
    folder = os.path.join(dump, checkpoint.folder)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    steps = [int(n[5:]) for n in names if n.startswith("step-") and n[5:].isdigit()]
    step = checkpoint.load_step if checkpoint.load_step != -1 else max(steps, default=-1)
    return os.path.join(folder, f"step-{step}") if step > 0 else None


LAYOUTS: dict[str, dict[str, tuple[str, ...]]] = {
    "empty": {"checkpoint": ()},
    "two saves": {"checkpoint/step-2": (".metadata",), "checkpoint/step-4": (".metadata",)},
    "an unfinished save": {"checkpoint/step-2": (".metadata",), "checkpoint/step-4": ()},
    "junk names": {
        "checkpoint/step-2": (".metadata",),
        "checkpoint/step-x": (".metadata",),
        "checkpoint/step-10-tmp": (".metadata",),
        "checkpoint/notes": (),
    },
    "an HF save": {"checkpoint/step-2": (".metadata",), "checkpoint/step-6": ("model.safetensors.index.json",)},
    "step 0 only": {"checkpoint/step-0": (".metadata",)},
    "no checkpoint folder": {"elsewhere": ()},
}


def _resume_mismatches(derive: Callable[[str, CheckpointManager.Config], str | None], tmp_path) -> list[tuple]:
    out = []
    for i, (name, layout) in enumerate(LAYOUTS.items()):
        dump = str(tmp_path / f"run{i}")
        _make(dump, layout)
        initial = str(tmp_path / "initial")
        os.makedirs(initial, exist_ok=True)
        settings = [dict(load_step=s, exclude_from_loading=x) for s in (-1, 0, 2, 4, 5) for x in ([], [DATALOADER])] + [
            dict(initial_load_path=initial, initial_load_model_only=m) for m in (True, False)
        ]
        for setting in settings:
            checkpoint = CheckpointManager.Config(enable=True, keep_latest_k=0, **setting)  # type: ignore[arg-type]
            if (theirs := _titan_resume(dump, checkpoint)) != (ours := derive(dump, checkpoint)):
                out.append((name, setting, theirs, ours))
    return out


def test_the_checkpoint_to_resume_is_the_one_torchtitan_loads(tmp_path):
    assert not _resume_mismatches(_ours_resume, tmp_path)


@pytest.mark.parametrize("step", [-1, 2])
def test_an_unfinished_save_missing_its_step_is_refused_as_torchtitan_does(tmp_path, step):
    """A step-4 without its .metadata (a save cut short) is not the latest: both resume from step-2."""
    dump = str(tmp_path)
    _make(dump, {"checkpoint/step-2": (".metadata",), "checkpoint/step-4": ()})
    checkpoint = CheckpointManager.Config(enable=True, keep_latest_k=0, load_step=step)
    assert (
        _ours_resume(dump, checkpoint) == _titan_resume(dump, checkpoint) == os.path.join(dump, "checkpoint", "step-2")
    )


def test_a_wrong_checkpoint_rule_is_caught(tmp_path):
    assert _resume_mismatches(_wrong_resume, tmp_path)
