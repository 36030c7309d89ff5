"""A real Azure Blob Storage emulator on loopback for tests: Azurite (npm), behind a small logging proxy.

Run as a process (`python tests/azureserver.py --port P --log F --azurite BIN`): it starts Azurite's blob
service on another free port and forwards every request to it, appending one JSON line per request to F
({"method", "key", "query", "range", "bytes"}), like tests/s3server.py and tests/gcsserver.py. `AzureServer`
starts it, makes a container and hands out the environment a client process needs: the usual
AZURE_STORAGE_CONNECTION_STRING with Azurite's well-known development account and key.

Azurite comes from `.ci/run` (`npm install --prefix .ci/node azurite`) or PATH; `azurite_binary` says
where, or why not.
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

from objectserver import BUCKET, FaultPlan, ObjectServer, free_port, send_fault, serve

# Azurite's development account: public, documented, the same in every installation
# (https://learn.microsoft.com/azure/storage/common/storage-use-azurite#well-known-storage-account-and-key).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# The faults tests/objectserver.py's FaultPlan serves, as Azure Blob Storage words them.
_ERRORS = {
    "503": (
        503,
        "application/xml",
        b"<?xml version='1.0' encoding='utf-8'?><Error><Code>ServerBusy</Code>"
        b"<Message>The server is currently unable to receive requests. Please retry your request.</Message></Error>",
    ),
    "500": (
        500,
        "application/xml",
        b"<?xml version='1.0' encoding='utf-8'?><Error><Code>InternalError</Code>"
        b"<Message>The server encountered an internal error. Please retry the request.</Message></Error>",
    ),
}
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def azurite_binary() -> tuple[str | None, str]:
    """(Azurite's blob service executable, "") or (None, why not)."""
    installed = os.path.join(_REPO, ".ci", "node", "node_modules", ".bin", "azurite-blob")
    found = installed if os.access(installed, os.X_OK) else shutil.which("azurite-blob")
    if found is None:
        return None, "Azurite is not installed (npm install --prefix .ci/node azurite, as .ci/run does)"
    return found, ""


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: Azurite never outlives the proxy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--azurite", required=True)
    args = parser.parse_args()
    upstream = free_port()
    azurite = subprocess.Popen(
        [args.azurite, "--blobHost", "127.0.0.1", "--blobPort", str(upstream), "--inMemoryPersistence"]
        + ["--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    signal.signal(signal.SIGTERM, lambda *_: (azurite.kill(), sys.exit(0)))
    for _ in range(200):
        try:
            http.client.HTTPConnection("127.0.0.1", upstream, timeout=1).connect()
            break
        except OSError:
            time.sleep(0.05)
    log, lock = open(args.log, "a", buffering=1), threading.Lock()
    faults = FaultPlan(args.log + ".faults")
    connections = threading.local()

    def _upstream() -> http.client.HTTPConnection:
        """This thread's kept-alive connection to Azurite (one per client connection)."""
        if not hasattr(connections, "one"):
            connections.one = http.client.HTTPConnection("127.0.0.1", upstream, timeout=60)
        return connections.one

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client expects of Azure

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            byte_range = self.headers.get("x-ms-range") or self.headers.get("Range")
            fault = faults.next_fault(self.command, self.path.partition("?")[0], byte_range)
            if fault in ("503", "500", "reset"):
                return send_fault(self, fault, _ERRORS)
            connection = _upstream()
            connection.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
            response = connection.getresponse()
            data = response.read()
            path, _, query = self.path.partition("?")
            entry = {
                "method": self.command,
                "key": path,
                "query": query,
                "range": byte_range,
                "bytes": 0 if self.command == "HEAD" else len(data),
            }
            with lock:
                log.write(json.dumps(entry) + "\n")
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                    self.send_header(key, value)
            length = response.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            if fault == "short":
                return send_fault(self, fault, _ERRORS, b"".join(self._headers_buffer) + b"\r\n" + data)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _forward

    serve(Proxy, args.port)


class AzureServer(ObjectServer):
    """Azurite on 127.0.0.1 behind the logging proxy, with one container (`BUCKET`)."""

    scheme = "az"
    health_path = f"/{ACCOUNT}?comp=list"

    def __init__(self, workdir: str, azurite: str):
        super().__init__(os.path.abspath(__file__), workdir, "--azurite", azurite)

    def _wait_until_serving(self) -> None:
        for _ in range(200):
            try:
                self.filesystem().get_file_info("probe")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"Azurite behind {self.endpoint} does not answer")

    def create_bucket(self) -> None:
        self.filesystem().create_dir(BUCKET)

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs: the usual connection string of Azure's clients."""
        return {
            "AZURE_STORAGE_CONNECTION_STRING": f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};"
            f"AccountKey={ACCOUNT_KEY};BlobEndpoint={self.endpoint}/{ACCOUNT};"
        }

    def filesystem(self, **options):
        from pyarrow import fs

        authority = f"127.0.0.1:{self.port}"
        return fs.AzureFileSystem(
            account_name=ACCOUNT,
            account_key=ACCOUNT_KEY,
            blob_storage_authority=authority,
            dfs_storage_authority=authority,
            blob_storage_scheme="http",
            dfs_storage_scheme="http",
            **options,
        )

    def stop(self) -> None:
        self.proc.terminate()  # the proxy stops Azurite on SIGTERM
        self.proc.wait()
        self.proc.stdout.close()


if __name__ == "__main__":
    main()
