"""What the object-storage servers of the tests share (tests/s3server.py: moto for S3;
tests/gcsserver.py: gcp-storage-emulator for GCS): each runs as its own process on a free loopback
port and appends one JSON line per request to a log ({"method", "key", "query", "range", "bytes"}:
bytes = response body sent), so a test can count a reader's requests and bound the bytes it asked for."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
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


class FaultPlan:
    """The faults a test asked the server to serve (ObjectServer.inject writes {"kind", "count"} to `path`): the
    next `count` data reads (GETs with a range) are answered with `kind` instead of their bytes. Kinds: "503"
    (throttled), "500" (an internal error), "short" (the full headers, then half the body, then the connection
    ends), "reset" (the connection closed with a TCP reset, no answer). Each fault served is a line in
    `path`.served. Read from a file so that a test in another process can change it while the server runs."""

    KINDS = ("503", "500", "short", "reset")

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()
        self.seen_mtime: int | None = None
        self.kind, self.remaining = "", 0

    def next_fault(self, method: str, key: str, byte_range: str | None) -> str:
        """The fault this request gets ("" for none)."""
        if method != "GET" or not byte_range:
            return ""
        with self.lock:
            try:
                mtime = os.stat(self.path).st_mtime_ns
            except FileNotFoundError:
                return ""
            if mtime != self.seen_mtime:  # a new plan
                with open(self.path) as f:
                    plan = json.load(f)
                self.seen_mtime, self.kind, self.remaining = mtime, plan["kind"], plan["count"]
            if self.remaining <= 0:
                return ""
            self.remaining -= 1
            with open(self.path + ".served", "a") as f:
                f.write(f"{self.kind} {key} {byte_range}\n")
            return self.kind


def reset(sock: socket.socket) -> None:
    """Close a connection with a TCP reset (SO_LINGER 0), as a broken network path does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def send_fault(handler, kind: str, errors: dict[str, tuple[int, str, bytes]], response: bytes = b"") -> None:
    """Answer an http.server request (`handler`) with fault `kind`: one of `errors` ({kind: (status,
    content type, body)}, as the provider words it), or for "short" the first part of `response` (the whole
    answer as the server wrote it: headers, then the body cut to half) before a reset, or a reset alone."""
    if kind in errors:
        status, content_type, body = errors[kind]
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
        return
    if kind == "short":
        head, _, body = response.partition(b"\r\n\r\n")
        handler.wfile.write(head + b"\r\n\r\n" + body[: len(body) // 2])
    handler.close_connection = True
    reset(handler.connection)


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

    def inject(self, kind: str, count: int) -> None:
        """Answer the next `count` data reads with a fault (FaultPlan); count 0 stops."""
        assert kind in FaultPlan.KINDS, kind
        with open(self.log_path + ".faults.tmp", "w") as f:
            json.dump({"kind": kind, "count": count}, f)
        os.replace(self.log_path + ".faults.tmp", self.log_path + ".faults")
        time.sleep(0.01)  # a new mtime for the next plan, whatever the filesystem's timestamp granularity

    def faults_served(self) -> list[str]:
        try:
            with open(self.log_path + ".faults.served") as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
