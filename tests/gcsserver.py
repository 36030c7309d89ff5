"""A real Google Cloud Storage emulator on loopback for tests: gcp-storage-emulator, plus a request log.

Run as a process (`python tests/gcsserver.py --port P --log F`); every request is appended to F as
one JSON line ({"method", "key", "query", "range", "bytes"}: bytes = response body sent), like
tests/s3server.py, so a test can count a reader's requests and bound the bytes it asked for.
`GcsServer` starts it on a free port, makes a bucket, uploads files and hands out the environment
a client process needs (STORAGE_EMULATOR_HOST, the variable Google's clients read for an emulator).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import threading
import urllib.request
from functools import partial
from http.server import ThreadingHTTPServer

from objectserver import BUCKET, FaultPlan, ObjectServer, send_fault

# The faults tests/objectserver.py's FaultPlan serves, as Google Cloud Storage's JSON API words them.
_ERRORS = {
    kind: (status, "application/json", json.dumps({"error": {"code": status, "message": message}}).encode())
    for kind, status, message in [("503", 503, "Backend Error"), ("500", 500, "Internal Error")]
}


def main() -> None:
    from gcp_storage_emulator import server as emulator
    from gcp_storage_emulator.storage import Storage

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    log, lock = open(args.log, "a", buffering=1), threading.Lock()

    faults = FaultPlan(args.log + ".faults")

    class LoggingHandler(emulator.RequestHandler):
        def do_GET(self):
            fault = faults.next_fault("GET", self.path.partition("?")[0], self.headers.get("Range"))
            if fault != "short":
                return send_fault(self, fault, _ERRORS) if fault else super().do_GET()
            wire, self.wfile = self.wfile, io.BytesIO()  # the emulator's whole answer, to send half of it
            super().do_GET()
            answer, self.wfile = self.wfile.getvalue(), wire
            send_fault(self, fault, _ERRORS, answer)

        def end_headers(self):
            # Logged from the response's Content-Length before its body is sent, so a client that
            # has its bytes always finds the request in the log.
            path, _, query = self.path.partition("?")
            length = int(next((v for k, v in self._headers_buffer_items() if k == "content-length"), 0))
            entry = {"method": self.command, "key": path, "query": query, "range": self.headers.get("Range")}
            with lock:
                log.write(json.dumps({**entry, "bytes": 0 if self.command == "HEAD" else length}) + "\n")
            super().end_headers()

        def _headers_buffer_items(self):
            for line in b"".join(getattr(self, "_headers_buffer", [])).decode("latin-1").split("\r\n"):
                key, sep, value = line.partition(":")
                if sep:
                    yield key.strip().lower(), value.strip()

    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), partial(LoggingHandler, Storage(use_memory_fs=True)))
    print("ready", flush=True)
    httpd.serve_forever()


class GcsServer(ObjectServer):
    """gcp-storage-emulator on 127.0.0.1, with one bucket (`BUCKET`)."""

    scheme = "gs"
    health_path = "/storage/v1/b"

    def __init__(self, workdir: str):
        super().__init__(os.path.abspath(__file__), workdir)

    def create_bucket(self) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=test",
            data=json.dumps({"name": BUCKET}).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=5).close()

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs: the emulator's address, as Google's clients read it."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def filesystem(self, **options):
        from pyarrow import fs

        return fs.GcsFileSystem(endpoint_override=f"127.0.0.1:{self.port}", scheme="http", anonymous=True, **options)


if __name__ == "__main__":
    main()
