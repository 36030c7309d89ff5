"""GCS and Azure Blob Storage as pyarrow filesystems, configured the way each provider's own clients are:
from the environment, never from the job config (it ends up in logs and checkpoints).

- `gs://bucket/key`: pyarrow's GcsFileSystem with Google's application default credentials
  (GOOGLE_APPLICATION_CREDENTIALS, gcloud, the metadata server); STORAGE_EMULATOR_HOST, the variable
  Google's clients read, points it at an emulator, anonymously.
- `hf://datasets/<org>/<name>@<commit>/<glob>`: huggingface_hub's HfFileSystem (fsspec), at HF_ENDPOINT
  with HF_TOKEN (or the token `hf auth login` saved). The commit is required (`check_pinned`).
- `az://container/key`: pyarrow's AzureFileSystem with the account of AZURE_STORAGE_CONNECTION_STRING
  (AccountName, AccountKey or SharedAccessSignature, BlobEndpoint or EndpointSuffix), else
  AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN or Azure's default
  credential (az login, a managed identity, AZURE_CLIENT_ID/...).

Errors that quote a client library go through `one_line`, which keeps its first line and hides
signatures, so a key or SAS token is never printed.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta

from pyarrow import fs as pafs

from zephon_titan.errors import ConfigError

# Where each provider's clients find credentials: named in errors.
CREDENTIALS = {
    "s3": "AWS_* environment variables",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS or gcloud auth application-default login",
    "az": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with a key, a SAS token or az login",
    "hf": "HF_TOKEN or hf auth login; HF_ENDPOINT for another Hub",
}
# What each calls the top level of a URI.
BUCKET_WORD = {"az": "container", "hf": "repository"}


def gcs_emulator() -> str:
    """The GCS emulator's URL from STORAGE_EMULATOR_HOST, or ""."""
    return os.environ.get("STORAGE_EMULATOR_HOST", "")


def gcs() -> pafs.FileSystem:
    """An emulator (anonymous; retries for 10 s, not pyarrow's 15 minutes, so a dead emulator is an
    error, not a hang), else GCS with the application default credentials."""
    endpoint = gcs_emulator()
    if not endpoint:
        return pafs.GcsFileSystem()
    scheme, _, host = endpoint.rpartition("://")
    return pafs.GcsFileSystem(
        anonymous=True, endpoint_override=host, scheme=scheme or "http", retry_time_limit=timedelta(seconds=10)
    )


def _connection_string() -> dict[str, str]:
    """AZURE_STORAGE_CONNECTION_STRING's `Key=value;` pairs (values may hold "=": keys end in it)."""
    text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    pairs = (part.split("=", 1) for part in text.split(";") if "=" in part)
    return {key.strip(): value.strip() for key, value in pairs}


def azure_endpoint() -> str:
    """The blob endpoint of the connection string (an emulator's, or another cloud's), or ""."""
    return _connection_string().get("BlobEndpoint", "")


def azure(root: str) -> pafs.FileSystem:
    """The storage account of the environment (see the module's docstring) holding `root` (az://container)."""
    settings = _connection_string()
    account = settings.get("AccountName") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME", "")
    if not account:
        raise ConfigError(f"cannot open {root!r}: no Azure storage account in the environment; set {CREDENTIALS['az']}")
    kwargs: dict[str, str] = {}
    key = settings.get("AccountKey") or os.environ.get("AZURE_STORAGE_ACCOUNT_KEY", "")
    sas = settings.get("SharedAccessSignature") or os.environ.get("AZURE_STORAGE_SAS_TOKEN", "")
    if key:
        kwargs["account_key"] = key
    elif sas:
        kwargs["sas_token"] = sas
    endpoint = settings.get("BlobEndpoint", "")
    if endpoint:
        scheme, _, rest = endpoint.rpartition("://")
        host = rest.split("/", 1)[0]
        # https://<account>.blob.<suffix>: pyarrow puts the account in front of the authority itself;
        # any other host (an emulator) is addressed path-style, /<account>/<container>.
        authority = host[len(account) :] if host.startswith(account + ".") else host
        kwargs.update(blob_storage_authority=authority, blob_storage_scheme=scheme or "https")
        kwargs.update(dfs_storage_authority=authority.replace(".blob.", ".dfs."), dfs_storage_scheme=scheme or "https")
    elif "EndpointSuffix" in settings:
        suffix = settings["EndpointSuffix"]
        kwargs.update(blob_storage_authority=f".blob.{suffix}", dfs_storage_authority=f".dfs.{suffix}")
    return pafs.AzureFileSystem(account, **kwargs)


_PINNED = re.compile(r"datasets/[^/@]+/[^/@]+@[0-9a-f]{40}(/.*)?")
HUB_BLOCK_BYTES = 1 << 16  # HfFileSystem reads ahead this much past what is asked (its default: 5 MiB)


def top_level(scheme: str, inner: str) -> str:
    """The bucket, container or (on the Hub) `datasets/<org>/<name>@<commit>` a path lies in."""
    return "/".join(inner.split("/")[: 3 if scheme == "hf" else 1])


def check_pinned(url: str) -> None:
    """A Hub dataset path must name a commit. A branch or tag can move under a run, and ranks that
    resolved it at different moments would read different files; a commit cannot move, and being in
    every file's path it is in the fingerprint."""
    inner = url.split("://", 1)[1]
    if not _PINNED.fullmatch(inner):
        raise ConfigError(
            f"path {url!r} does not name a dataset at a commit: write hf://datasets/<org>/<name>@<40-hex commit>/<glob> "
            "(a branch or tag can move under a run; the commit of a branch: "
            "huggingface_hub.HfApi().dataset_info('<org>/<name>', revision='main').sha)"
        )


def hub() -> pafs.FileSystem:
    """The Hub (HF_ENDPOINT, read now: huggingface_hub reads it once at import) through HfFileSystem."""
    from huggingface_hub import HfFileSystem
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    endpoint, token = os.environ.get("HF_ENDPOINT") or None, os.environ.get("HF_TOKEN") or None
    return PyFileSystem(FSSpecHandler(HfFileSystem(endpoint=endpoint, token=token, block_size=HUB_BLOCK_BYTES)))


_SIGNATURE = re.compile(r"((?:sig|AccountKey|SharedAccessSignature)=|Bearer )[^&;\s]+", re.IGNORECASE)


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "")


def one_line(error: BaseException) -> str:
    """A client library's error cut to its first line, before the details some append (google-cloud's
    `error_info={...}`), with any signature or key in it replaced by ***."""
    text = str(error).strip()
    first = text.splitlines()[0].split(" error_info=", 1)[0] if text else type(error).__name__
    return _SIGNATURE.sub(r"\1***", first)
