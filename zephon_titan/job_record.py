"""A job's resolution through TorchTitan, remembered: `validate`, `plan`, `inspect` and `where` answer a job they
have resolved before in about a second instead of after TorchTitan's imports (~4 s quiet, a minute loaded).

What those commands take from TorchTitan's resolution (titan/job.py: the recipe's defaults, its model, the
validator's schedule) is a dozen numbers (FIELDS). After a full resolution `remember` writes them to a small JSON
record in the user's cache, named by the SHA-256 of every input the resolution read: the job's tables as the first
pass read them (job_file.py, `extends` chains merged), the versions of Python, torch, TorchTitan and this
package, the import path and the current directory; and, checked each time the record is read, the size and
modification time of every source file the resolution imported outside the installed packages and the standard
library, plus TorchTitan's and this package's own (the recipe's module, a user's recipe, an editable TorchTitan).

A record is written only when its values give back every value the full resolution gives (`RecordedJob` against
`Job`, field by field, at write time) and the trainer's tokenizer is TorchTitan's default one; a job that fails
to resolve is never recorded, so a mistake is always reported by the full resolution. tests/unit/test_job_record.py
compares validate's whole output with and without a record. `ZEPHON_TITAN_CACHE` names the cache folder
(default `$XDG_CACHE_HOME/zephon_titan`, else `~/.cache/zephon_titan`); `ZEPHON_TITAN_CACHE=off` turns records off.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
import tempfile
from importlib import metadata
from typing import TYPE_CHECKING, Any

from zephon_titan import __version__
from zephon_titan.job_file import JobFile, read_job_file
from zephon_titan.job_view import FileJob, LoaderJob

if TYPE_CHECKING:
    from zephon_titan.titan.job import Job

RECORD_VERSION = 1
# The resolved values a record holds: LoaderJob's properties that TorchTitan's config answers.
FIELDS = (
    "seq_len",
    "global_batch_size",
    "local_batch_size",
    "hf_assets_path",
    "training_steps",
    "model_vocab_size",
    "model_max_seq_len",
    "cuda_graphs",
    "seq_len_divisor",
    "eval_enabled",
    "eval_freq",
    "eval_steps",
    "eval_global_batch_size",
)
# Compared at write time too (the file's own reading of them must equal the resolution's).
DERIVED = ("data", "eval_data", "tokenizer_setting")
# The cache keeps at most this many records (the oldest go first); each is a few KB.
MAX_RECORDS = 256


class RecordedJob(FileJob):
    """A job file with the values of its remembered resolution (FileJob reads the first five from `values` too)."""

    @property
    def training_steps(self) -> int:
        return self._values["training_steps"]

    @property
    def model_vocab_size(self) -> int | None:
        return self._values["model_vocab_size"]

    @property
    def model_max_seq_len(self) -> int | None:
        return self._values["model_max_seq_len"]

    @property
    def cuda_graphs(self) -> bool:
        return self._values["cuda_graphs"]

    @property
    def seq_len_divisor(self) -> int:
        return self._values["seq_len_divisor"]

    @property
    def eval_enabled(self) -> bool:
        return self._values["eval_enabled"]

    @property
    def eval_freq(self) -> int:
        return self._values["eval_freq"]

    @property
    def eval_global_batch_size(self) -> int:
        return self._values["eval_global_batch_size"]

    @property
    def eval_steps(self) -> int:
        return self._values["eval_steps"]


def cache_folder() -> str | None:
    """Where records live (None: records are off)."""
    chosen = os.environ.get("ZEPHON_TITAN_CACHE")
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "false") else os.path.join(chosen, "jobs")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "zephon_titan", "jobs")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def record_key(file: JobFile) -> str:
    """The SHA-256 of every input of the resolution but the source files (checked by their signatures)."""
    inputs = {
        "record": RECORD_VERSION,
        "job": [file.document, file.model, file.dataloader, file.validator],
        "versions": [sys.version, __version__, _version("torch"), _version("torchtitan")],
        "import_path": sys.path,
        "cwd": os.getcwd(),
    }
    text = json.dumps(inputs, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _signature(path: str) -> list[Any] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [path, st.st_size, st.st_mtime_ns]


def _resolution_sources() -> list[str]:
    """The source files the resolution imported that a version does not pin: TorchTitan's and this package's
    own, and every module outside the installed packages and the standard library (a user's recipe)."""
    import torchtitan

    import zephon_titan

    ours = tuple(os.path.dirname(m.__file__) + os.sep for m in (torchtitan, zephon_titan) if m.__file__)
    paths = sysconfig.get_paths()
    pinned = tuple({paths[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})
    files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    return sorted(
        f for f in files if isinstance(f, str) and os.path.isabs(f) and (f.startswith(ours) or not f.startswith(pinned))
    )


def recall(file: JobFile) -> RecordedJob | None:
    """The job's remembered resolution, if one was recorded for these inputs and no source file changed."""
    folder = cache_folder()
    if folder is None:
        return None
    try:
        with open(os.path.join(folder, record_key(file) + ".json"), encoding="utf-8") as f:
            record = json.load(f)
        if record["version"] != RECORD_VERSION or any(_signature(s[0]) != s for s in record["sources"]):
            return None
        values = {name: record["values"][name] for name in FIELDS}
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None  # none, unreadable or of another layout: resolve in full (and write it again)
    values["steps"] = values["training_steps"]
    return RecordedJob(file, values)


def remember(file: JobFile, job: Job) -> None:
    """Record `job` (a full resolution of `file` with no overrides) when its values give it back whole."""
    folder = cache_folder()
    if folder is None or not _default_tokenizer(job):
        return
    values = {name: getattr(job, name) for name in FIELDS}
    recorded = RecordedJob(file, {**values, "steps": values["training_steps"]})
    if any(getattr(recorded, name) != getattr(job, name) for name in FIELDS + DERIVED):
        return  # the file's reading differs from the resolution somewhere: never trust a record of it
    record = {"version": RECORD_VERSION, "values": values, "sources": []}
    record["sources"] = [s for s in map(_signature, _resolution_sources()) if s is not None]
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False, encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(f.name, os.path.join(folder, record_key(file) + ".json"))  # whole or not at all
        _prune(folder)
    except OSError:
        return  # a cache that cannot be written only costs the next command its speed


def _default_tokenizer(job: Job) -> bool:
    """The trainer builds TorchTitan's default tokenizer from hf_assets_path (what RecordedJob builds)."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    return job.config.tokenizer == HuggingFaceTokenizer.Config()


def _prune(folder: str) -> None:
    records = [e for e in os.scandir(folder) if e.name.endswith(".json")]
    if len(records) > MAX_RECORDS:
        for entry in sorted(records, key=lambda e: e.stat().st_mtime_ns)[: len(records) - MAX_RECORDS]:
            os.unlink(entry.path)


def resolved_job(path: str, file: JobFile | None = None) -> LoaderJob:
    """The job as TorchTitan resolves it (no overrides): remembered, else resolved in full and remembered."""
    from zephon_titan import progress

    file = file if file is not None else read_job_file(path)
    recorded = recall(file)
    if recorded is not None:
        progress.doing(
            "resolving the job as last time (job, recipe and versions unchanged: no TorchTitan trainer to import)"
        )
        return recorded
    progress.doing("importing TorchTitan to resolve the job")
    from zephon_titan.titan.job import load_job

    job = load_job(path)
    remember(file, job)
    return job
