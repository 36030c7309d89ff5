"""A local stand-in for the Hugging Face Hub's file API, for tests: enough of it for huggingface_hub's
HfFileSystem to list and range-read the Parquet files of a dataset repository at a commit.

Run as a process (`python tests/hubserver.py --port P --log F --root DIR [--token T]`); it serves
DIR/<org>/<name>/<commit>/<files> (`HubServer.publish` writes them) and answers, like the Hub:
  GET  /api/datasets/<org>/<name>/revision/<rev>      the repo at a revision (404 + X-Error-Code if not)
  GET  /api/datasets/<org>/<name>/tree/<rev>[/<path>]  the files and folders under a path (recursive=)
  POST /api/datasets/<org>/<name>/paths-info/<rev>     the records of the given paths
  GET  /datasets/<org>/<name>/resolve/<rev>/<path>     the file's bytes, honouring Range
With --token, every request must carry `Authorization: Bearer <token>` (else 401, as the Hub answers a
wrong token). Each request is one JSON line in the log, as in tests/objectserver.py.
Not covered: branches and tags (a revision is a commit folder), pagination, LFS/Xet metadata, gated repos.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote

from objectserver import ObjectServer, serve


def _records(repo: str, base: str, recursive: bool) -> list[dict]:
    """The Hub's tree records of what lies under `base` (a folder in the commit folder `repo`)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(repo, base)):
        rel = os.path.relpath(dirpath, repo)
        for name in sorted(dirnames):
            out.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": os.path.normpath(f"{rel}/{name}")})
        for name in sorted(filenames):
            out.append(_file_record(repo, os.path.normpath(f"{rel}/{name}")))
        if not recursive:
            break
    return out


def _file_record(repo: str, path: str) -> dict:
    with open(os.path.join(repo, path), "rb") as f:
        oid = hashlib.sha1(f.read()).hexdigest()
    return {"type": "file", "oid": oid, "size": os.path.getsize(os.path.join(repo, path)), "path": path}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--token", default="")
    args = parser.parse_args()
    log, lock = open(args.log, "a", buffering=1), threading.Lock()

    class Hub(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            path, _, query = self.path.partition("?")
            entry = {"method": self.command, "key": unquote(path), "query": query, "range": self.headers.get("Range")}
            with lock:
                log.write(json.dumps({**entry, "bytes": 0 if self.command == "HEAD" else len(body)}) + "\n")
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, obj) -> None:
            self._reply(200, json.dumps(obj).encode(), {"Content-Type": "application/json"})

        def _error(self, status: int, code: str, message: str) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message} if code else {"X-Error-Message": message}
            self._reply(status, json.dumps({"error": message}).encode(), headers)

        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if args.token and self.headers.get("Authorization") != f"Bearer {args.token}":
                return self._error(401, "", "Invalid credentials in Authorization header")
            path, _, query = self.path.partition("?")
            parts = path.split("/")
            api = parts[1] == "api"
            if parts[1 + api] != "datasets" or len(parts) < 6 + api:
                return self._error(404, "EntryNotFound", f"no such route {path}")
            org, name, action, rev = parts[2 + api : 6 + api]
            rest = unquote("/".join(parts[6 + api :]))
            repo_dir = os.path.join(args.root, org, name)
            if not os.path.isdir(repo_dir):
                return self._error(404, "RepoNotFound", "Repository not found")
            repo = os.path.join(repo_dir, unquote(rev))
            if not os.path.isdir(repo):
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {unquote(rev)}")
            if action == "revision":
                return self._json({"id": f"{org}/{name}", "sha": unquote(rev), "siblings": []})
            if action == "tree":
                if not os.path.isdir(os.path.join(repo, rest)):
                    return self._error(404, "EntryNotFound", f"{rest} does not exist")
                recursive = parse_qs(query).get("recursive", ["False"])[0].lower() == "true"
                return self._json(_records(repo, rest, recursive))
            if action == "paths-info":
                wanted = parse_qs(body.decode()).get("paths", [])
                found = [p for p in wanted if os.path.exists(os.path.join(repo, p))]
                return self._json(
                    [
                        _file_record(repo, p) if os.path.isfile(os.path.join(repo, p)) else _records(repo, p, False)[0]
                        for p in found
                    ]
                )
            if action == "resolve":
                file = os.path.join(repo, rest)
                if not os.path.isfile(file):
                    return self._error(404, "EntryNotFound", f"{rest} does not exist")
                with open(file, "rb") as f:
                    data = f.read()
                headers = {
                    "Accept-Ranges": "bytes",
                    "X-Repo-Commit": unquote(rev),
                    "ETag": f'"{_file_record(repo, rest)["oid"]}"',
                }
                wanted_range = self.headers.get("Range", "")
                if wanted_range.startswith("bytes="):
                    first, _, last = wanted_range[6:].partition("-")
                    start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                    return self._reply(206, data[start : end + 1], headers)
                return self._reply(200, data, headers)
            return self._error(404, "EntryNotFound", f"no such route {path}")

        do_GET = do_POST = do_HEAD = _handle

    serve(Hub, args.port)


class HubServer(ObjectServer):
    """The stand-in Hub on 127.0.0.1 (`token`: the one HF_TOKEN it accepts)."""

    scheme = "hf"
    health_path = "/api/datasets/none/none/revision/none"
    token = "hf_zephonTestToken0123456789"

    def __init__(self, workdir: str):
        self.root = os.path.join(workdir, "hub")
        os.makedirs(self.root, exist_ok=True)
        super().__init__(os.path.abspath(__file__), workdir, "--root", self.root, "--token", self.token)

    def create_bucket(self) -> None:
        pass  # a repository is made by publishing its files

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs: the Hub's address and a token, the variables huggingface_hub reads."""
        return {"HF_ENDPOINT": self.endpoint, "HF_TOKEN": self.token}

    def upload(self, local_dir: str, prefix: str) -> str:
        """As the buckets' upload: `local_dir` published as dataset `zephon/<prefix>` (its URI, at the commit)."""
        return self.publish(local_dir, f"zephon/{prefix.replace('/', '-')}")

    def publish(self, local_dir: str, repo_id: str) -> str:
        """Publish a local folder as a commit of dataset `repo_id`; the commit id is the SHA-1 of its
        files' names and bytes. Returns `hf://datasets/<repo_id>@<commit>`."""
        digest = hashlib.sha1()
        for dirpath, _, filenames in sorted(os.walk(local_dir)):
            for name in sorted(filenames):
                digest.update(os.path.relpath(os.path.join(dirpath, name), local_dir).encode())
                with open(os.path.join(dirpath, name), "rb") as f:
                    digest.update(f.read())
        commit = digest.hexdigest()
        shutil.copytree(local_dir, os.path.join(self.root, repo_id, commit), dirs_exist_ok=True)
        return f"hf://datasets/{repo_id}@{commit}"


if __name__ == "__main__":
    main()
