"""What the loader's commands (plan, inspect, where) need of a job, and a job file that states all of it.

`LoaderJob` is that need: the data config, seq_len, the batch sizes, the tokenizer, the engine spec, the
batch layout and the eval set. titan/job.py's `Job` resolves it through TorchTitan's config (recipe
defaults + file + overrides); `FileJob` reads it from the file alone, without TorchTitan, when the file
states every value that would otherwise be the recipe's: `[training] seq_len`, `local_batch_size`,
`global_batch_size`, the tokenizer folder (`[dataloader] tokenizer_path` or `hf_assets_path`, with no
`[tokenizer]` table) and, under pipeline parallelism, `pipeline_parallel_microbatch_size`. The two give the
same values (tests/unit/test_job_file.py compares them, and plan's ledgers). The model is the recipe's:
FileJob checks the vocabulary only against a stated `[model] vocab_size`; validate and run check the
recipe's model in any case.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any

from zephon_titan.config import DataConfig
from zephon_titan.engine import DocumentTokenizer, EngineSpec, build_engine, validate_batch_layout
from zephon_titan.errors import ConfigError
from zephon_titan.job_file import DEFAULT_EVAL_STEPS, JobFile, check_eval_data, eval_message, titan_layout_message
from zephon_titan.titan.tokenizer import load_hf_tokenizer, loader_tokenizer


class LoaderJob:
    """The values below, and what the loader's commands derive from them."""

    path: str
    """The job file's absolute path (errors name it)."""

    @property
    def data(self) -> DataConfig:
        raise NotImplementedError

    @property
    def seq_len(self) -> int:
        raise NotImplementedError

    @property
    def global_batch_size(self) -> int:
        raise NotImplementedError

    @property
    def local_batch_size(self) -> int:
        """Rows per microbatch as the trainer passes it to the loader (the PP microbatch size under PP)."""
        raise NotImplementedError

    @property
    def hf_assets_path(self) -> str:
        """The trainer's tokenizer folder."""
        raise NotImplementedError

    @property
    def model_vocab_size(self) -> int | None:
        raise NotImplementedError

    @property
    def training_steps(self) -> int:
        raise NotImplementedError

    @property
    def eval_data(self) -> DataConfig:
        """The eval set's data (no sources: there is no eval data)."""
        raise NotImplementedError

    @property
    def eval_global_batch_size(self) -> int:
        raise NotImplementedError

    @property
    def eval_steps(self) -> int:
        raise NotImplementedError

    # What only validate reads (titan/job.py's Job from TorchTitan's config; job_record.py's RecordedJob from a
    # remembered resolution): the model's bound, what the trainer's shapes allow, and the eval schedule.
    @property
    def model_max_seq_len(self) -> int | None:
        """The model's longest sequence (TorchTitan's Decoder.Config.max_seq_len: its RoPE cache), if it says."""
        raise NotImplementedError

    @property
    def cuda_graphs(self) -> bool:
        """Whether TorchTitan may capture CUDA graphs (`[training] disable_cuda_graphs` false)."""
        raise NotImplementedError

    @property
    def seq_len_divisor(self) -> int:
        """What every row length must be divisible by under context or sequence parallelism (1: anything)."""
        raise NotImplementedError

    @property
    def eval_enabled(self) -> bool:
        raise NotImplementedError

    @property
    def eval_freq(self) -> int:
        raise NotImplementedError

    @property
    def tokenizer_setting(self) -> tuple[str, str]:
        """(key, path) of the tokenizer directory: [dataloader] tokenizer_path, else hf_assets_path."""
        if self.data.tokenizer_path:
            return "[dataloader] tokenizer_path", self.data.tokenizer_path
        return "hf_assets_path", self.hf_assets_path

    def trainer_tokenizer(self) -> Any:
        """The tokenizer object TorchTitan's trainer builds from hf_assets_path."""
        return load_hf_tokenizer(self.hf_assets_path, "hf_assets_path")

    @cached_property
    def tokenizer(self) -> DocumentTokenizer:
        """The loader's tokenizer, as ZephonDataLoader builds it from the trainer's (titan/tokenizer.py)."""
        return loader_tokenizer(self.data, self.trainer_tokenizer)

    @cached_property
    def spec(self) -> EngineSpec:
        """The engine spec (opens every source: file sizes, Parquet footers; reads no document)."""
        from zephon_titan import progress

        progress.doing(f"opening {len(self.data.sources)} sources")
        return build_engine(self.data, self.seq_len, self.tokenizer)

    def check_layout(self, dp_world_size: int) -> int:
        """The batch layout at this data-parallel size; returns rows per lane per step."""
        try:
            return validate_batch_layout(
                self.data.num_lanes, self.global_batch_size, dp_world_size, self.local_batch_size
            )
        except ConfigError as e:
            raise ConfigError(f"{self.path}: {titan_layout_message(e)}") from None

    def check_model_vocab(self) -> None:
        """A model with fewer embeddings than the tokenizer has ids fails at step 1 with an IndexError."""
        from zephon_titan import progress

        progress.doing("loading the tokenizer and the model's vocabulary")
        model, ids = self.model_vocab_size, self.tokenizer.vocab_size  # the tokenizer first: a wrong path is named
        if model is not None and model < ids:
            key, path = self.tokenizer_setting
            raise ConfigError(
                f"{self.path}: the model's vocabulary ({model} embeddings) is smaller than the tokenizer's ({ids} ids, "
                f"{key} = {path!r}); set [model] vocab_size = {_round_up(ids, 64)} or use the model's own tokenizer"
            )

    def check_model_seq_len(self) -> None:
        """A seq_len above the model's maximum fails when TorchTitan builds the model (after the resume checks);
        say it first, in one line. A resume may change seq_len (docs/changing-a-run.md), up to this bound."""
        most = self.model_max_seq_len
        if most is not None and self.seq_len > most:
            raise ConfigError(
                f"{self.path}: [training] seq_len = {self.seq_len} is above the model's maximum sequence length "
                f"{most} (its RoPE max_seq_len); use seq_len <= {most} or a model configured for longer sequences"
            )

    def check_seq_len_schedule(self) -> None:
        """`[[dataloader.phases]] seq_len` (engine/seq_len_schedule.py checks each against training.seq_len):
        TorchTitan's CUDA graphs (on by default on NVIDIA GPUs) refuse an input of another shape, and context or
        sequence parallelism needs every length divisible as it checks training.seq_len."""
        eras = self.spec.job_eras
        if not eras:
            return
        lengths = ", ".join(f"{e.seq_len} from step {e.start}" for e in eras)
        if self.cuda_graphs:
            raise ConfigError(
                f"{self.path}: [[dataloader.phases]] seq_len ({lengths}) needs [training] disable_cuda_graphs = true: "
                "TorchTitan's CUDA graphs refuse inputs of another shape"
            )
        divisor = self.seq_len_divisor
        odd = [e for e in eras if e.seq_len % divisor]
        if odd:
            raise ConfigError(
                f"{self.path}: [[dataloader.phases]] seq_len {odd[0].seq_len} (from step {odd[0].start}) is not "
                f"divisible by {divisor}, as the context/sequence parallelism needs (TorchTitan checks training.seq_len)"
            )

    def check_eval_layout(self, dp_world_size: int) -> None:
        """The eval set's batch layout at this data-parallel size (when validation is on)."""
        if not self.eval_enabled:
            return
        data = self.eval_data
        check_eval_data(data)
        try:
            validate_batch_layout(data.num_lanes, self.eval_global_batch_size, dp_world_size, self.local_batch_size)
        except ConfigError as e:
            raise ConfigError(f"{self.path}: {eval_message(e)}") from None


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class FileJob(LoaderJob):
    """A LoaderJob read from the file alone (`of`: None when the file leaves a value to the recipe)."""

    def __init__(self, file: JobFile, values: dict[str, Any]):
        self.file = file
        self.path = os.path.abspath(file.path)
        self._values = values

    @classmethod
    def of(cls, file: JobFile, needs_steps: bool = False) -> FileJob | None:
        values: dict[str, Any] = {
            key: file.stated("training", key, int) for key in ("seq_len", "local_batch_size", "global_batch_size")
        }
        values["steps"] = file.stated("training", "steps", int)
        values["hf_assets_path"] = file.stated(None, "hf_assets_path", str)
        pipeline = file.stated("parallelism", "pipeline_parallel_degree", int)
        if pipeline is not None and pipeline > 1:
            values["local_batch_size"] = file.stated("parallelism", "pipeline_parallel_microbatch_size", int)
        tokenizer_known = bool(file.data.tokenizer_path) or values["hf_assets_path"] is not None
        if (
            None in (values["seq_len"], values["local_batch_size"], values["global_batch_size"])
            or not tokenizer_known
            or "tokenizer" in file.document  # the trainer's tokenizer config: TorchTitan's
            or (needs_steps and values["steps"] is None)
        ):
            return None
        return cls(file, values)

    @property
    def data(self) -> DataConfig:
        return self.file.data

    @property
    def seq_len(self) -> int:
        return self._values["seq_len"]

    @property
    def global_batch_size(self) -> int:
        return self._values["global_batch_size"]

    @property
    def local_batch_size(self) -> int:
        return self._values["local_batch_size"]

    @property
    def hf_assets_path(self) -> str:
        return self._values["hf_assets_path"] or ""

    @property
    def model_vocab_size(self) -> int | None:
        return self.file.model.get("vocab_size")

    @property
    def training_steps(self) -> int:
        return self._values["steps"]

    @property
    def eval_data(self) -> DataConfig:
        return self.file.eval.data or DataConfig()

    @property
    def eval_global_batch_size(self) -> int:
        return self.file.eval.global_batch_size or self.global_batch_size

    @property
    def eval_steps(self) -> int:
        steps = self.file.stated_validator("steps", int)
        return DEFAULT_EVAL_STEPS if steps is None else steps
