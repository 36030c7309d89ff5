"""Job files: TOML read safely, with `[job] extends` chains. Every entry point reads a job file here.

`[job] extends = "base.toml"` (relative to the file) starts from another file and overrides it
table by table, so variants of a job (other GPU counts, other mixtures) state only what differs.
Only regular files of bounded size are read (never a FIFO, a device or a directory), chains are
bounded and cycles named. The tables' meaning lives above (titan/job.py) and below (config/).
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from zephon_titan.config import DataConfig, config_from_dict, short_repr
from zephon_titan.errors import ConfigError

# Job files (and what `[job] extends` names) are read only if regular, at most this size and chain length.
MAX_TOML_BYTES = 1 << 20
MAX_EXTENDS = 32


def load_toml(path: str) -> dict[str, Any]:
    """Parse a TOML job file. `[job] extends = "base.toml"` (relative to this file) starts
    from another file and overrides it table by table, so variants of a job (other GPU
    counts, other mixtures) state only what differs."""
    chain = [os.path.abspath(path)]  # as written (relative extends start from there); cycles by real path
    documents = [_read_toml(chain[0], "config file ")]
    while (base := _job_table(documents[-1], chain[-1]).pop("extends", None)) is not None:
        where = f"{chain[-1]}: [job] extends"
        if not isinstance(base, str) or "\0" in base:
            raise ConfigError(f"{where} must be a path string, got {short_repr(base)}")
        base_path = os.path.abspath(os.path.join(os.path.dirname(chain[-1]), base))
        real = [os.path.realpath(p) for p in chain]
        if os.path.realpath(base_path) in real:
            shown = chain[real.index(os.path.realpath(base_path)) :] + [base_path]
            raise ConfigError(f"{where} forms a cycle: {' -> '.join(shown)}; remove one of the extends")
        if len(chain) >= MAX_EXTENDS:
            raise ConfigError(
                f"{where}: the chain from {chain[0]} is over {MAX_EXTENDS} files long; merge some of the files"
            )
        chain.append(base_path)
        documents.append(_read_toml(base_path, f"{where} = {short_repr(base)}: "))
    merged = documents.pop()
    while documents:
        merged = _merge(merged, documents.pop())
    return merged


def _job_table(document: dict[str, Any], path: str) -> dict[str, Any]:
    job = document.get("job", {})
    if not isinstance(job, dict):
        raise ConfigError(
            f"{path}: job must be a table ([job], a free-form description and `extends`), got {short_repr(job)}"
        )
    return job


def _read_toml(path: str, where: str) -> dict[str, Any]:
    """One TOML file: a regular file of at most MAX_TOML_BYTES of UTF-8 text. Never blocks on a FIFO
    (checked before opening, opened non-blocking) and never reads a device or more than the bound."""
    fix = "point it at a TOML file"
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{where}{path} is not a regular file ({_kind(mode)}); {fix}")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between stat and open
                raise ConfigError(f"{where}{path} is not a regular file; {fix}")
            data = os.read(fd, MAX_TOML_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise ConfigError(f"{where}{path} does not exist") from None
    except (OSError, ValueError) as e:  # ELOOP (a symlink loop), EACCES, a NUL in the path
        raise ConfigError(f"{where}cannot read {path}: {getattr(e, 'strerror', None) or e}; {fix}") from None
    if len(data) > MAX_TOML_BYTES:
        raise ConfigError(f"{where}{path} is over {MAX_TOML_BYTES} bytes, too big for a job file; {fix}")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}{path} is not UTF-8 text (byte {e.start}); {fix}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}{path} is not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{where}{path} nests arrays or tables too deeply to be a job file") from None


def _kind(mode: int) -> str:
    kinds = {
        stat.S_ISDIR: "a directory",
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a file")


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`, table by table (iterative: nesting depth costs no stack)."""
    out = dict(base)
    pending = [(out, override)]
    while pending:
        target, table = pending.pop()
        for key, value in table.items():
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                target[key] = dict(target[key])
                pending.append((target[key], value))
            else:
                target[key] = value
    return out


def load_data_config(path: str) -> DataConfig:
    """Read the `[dataloader]` table of a job TOML file."""
    document = load_toml(path)
    if "dataloader" not in document:
        raise ConfigError(f"{path} has no [dataloader] table")
    try:
        return config_from_dict(document["dataloader"])
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
