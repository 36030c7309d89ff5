"""What the object-storage servers of the tests share (tests/s3server.py: moto for S3;
tests/gcsserver.py: gcp-storage-emulator for GCS): each runs as its own process on a free loopback
port and appends one JSON line per request to a log ({"method", "key", "query", "range", "bytes"}:
bytes = response body sent), so a test can count a reader's requests and bound the bytes it asked for."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

BUCKET = "zephon-test"


def serve(handler, port: int) -> None:
    """Serve `handler` (a BaseHTTPRequestHandler class) on 127.0.0.1:port, one thread a request, after
    telling the parent (`ObjectServer`) it is ready; never returns."""
    from http.server import ThreadingHTTPServer

    handler.log_message = lambda *args: None  # the request log is the JSON lines, not stderr
    httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
    print("ready", flush=True)
    httpd.serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ObjectServer:
    """A server process (`script --port P --log F [args]`, printing "ready") with one bucket (`BUCKET`).
    Subclasses say how to reach it (`filesystem`, `env`), how to tell it is serving (`health_path`)
    and how to make the bucket (`create_bucket`)."""

    scheme = ""
    health_path = "/"

    def __init__(self, script: str, workdir: str, *args: str):
        self.port = free_port()
        self.log_path = os.path.join(workdir, f"{self.scheme}_requests_{self.port}.jsonl")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, script, "--port", str(self.port), "--log", self.log_path, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the {self.scheme} server did not start")
        self._wait_until_serving()
        self.create_bucket()

    def _wait_until_serving(self) -> None:
        for _ in range(100):
            try:
                urllib.request.urlopen(self.endpoint + self.health_path, timeout=1)
                return
            except urllib.error.HTTPError:  # an answer, even an error, means it serves
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the {self.scheme} server at {self.endpoint} does not answer")

    def create_bucket(self) -> None:
        raise NotImplementedError

    def filesystem(self, **options):
        raise NotImplementedError

    def upload(self, local_dir: str, prefix: str) -> str:
        """Copy a local directory tree to BUCKET/prefix; returns its URI."""
        from pyarrow import fs

        fs.copy_files(
            local_dir,
            f"{BUCKET}/{prefix}",
            source_filesystem=fs.LocalFileSystem(),
            destination_filesystem=self.filesystem(),
        )
        return f"{self.scheme}://{BUCKET}/{prefix}"

    def requests(self) -> list[dict]:
        """The requests served so far (since the last clear_requests)."""
        if not os.path.exists(self.log_path):
            return []
        with open(self.log_path) as f:
            return [json.loads(line) for line in f]

    def clear_requests(self) -> None:
        open(self.log_path, "w").close()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
