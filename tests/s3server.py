"""A real S3-compatible server on loopback for tests and benchmarks: moto's server, plus a request log.

Run as a process (`python tests/s3server.py --port P --log F`); every request is
appended to F as one JSON line ({"method", "key", "query", "range", "bytes"}: bytes = response body
sent), so a test can count a reader's requests and bound the bytes it asked for. `S3Server` starts it on a free port, makes a bucket, uploads files and hands out the
environment (endpoint, region, dummy credentials) a client process needs.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

from objectserver import BUCKET, FaultPlan, ObjectServer, reset

__all__ = ["BUCKET", "S3Server"]


class _RequestLog:
    """WSGI middleware: one log line per request, with the body bytes of its response."""

    def __init__(self, app, path: str, latency_ms: float = 0.0):
        self.app = app
        self.file = open(path, "a", buffering=1)
        self.lock = threading.Lock()
        self.latency = latency_ms / 1000

    def __call__(self, environ, start_response):
        if self.latency:
            time.sleep(self.latency)  # an object store's time to first byte (benchmarks)
        entry = {
            "method": environ["REQUEST_METHOD"],
            "key": environ.get("PATH_INFO", ""),
            "query": environ.get("QUERY_STRING", ""),
            "range": environ.get("HTTP_RANGE"),
        }

        def logging_start_response(status, headers, *args):
            # Logged from the response's Content-Length before its body is sent, so a client that
            # has its bytes always finds the request in the log.
            if not entry["key"].startswith("/moto-api"):
                length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
                body = 0 if entry["method"] == "HEAD" else length
                with self.lock:
                    self.file.write(json.dumps({**entry, "bytes": body}) + "\n")
            return start_response(status, headers, *args)

        return self.app(environ, logging_start_response)


class _Faults:
    """WSGI middleware that serves the faults of a FaultPlan (objectserver.py) as S3 words them."""

    ERRORS = {
        "503": ("503 Service Unavailable", "SlowDown", "Please reduce your request rate."),
        "500": ("500 Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    }

    def __init__(self, app, path: str):
        self.app, self.plan = app, FaultPlan(path)

    def __call__(self, environ, start_response):
        kind = self.plan.next_fault(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("HTTP_RANGE"))
        if kind in self.ERRORS:
            status, code, message = self.ERRORS[kind]
            body = (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
            )
            start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
            return [body.encode()]
        if kind == "reset":
            reset(environ["werkzeug.socket"])
            raise ConnectionResetError("fault injected: connection reset")
        if kind == "short":  # the headers as the server sends them, then half the body, then the connection ends
            body = b"".join(self.app(environ, start_response))

            def cut_short():
                yield body[: len(body) // 2]
                reset(environ["werkzeug.socket"])
                raise ConnectionResetError("fault injected: body cut short")

            return cut_short()
        return self.app(environ, start_response)


def main() -> None:
    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added before every response")
    args = parser.parse_args()
    app = _RequestLog(DomainDispatcherApplication(create_backend_app), args.log, args.latency_ms)
    app = _Faults(app, args.log + ".faults")
    server = make_server("127.0.0.1", args.port, app, threaded=True, request_handler=MotoRequestHandler)
    print("ready", flush=True)
    server.serve_forever()


class S3Server(ObjectServer):
    """moto in server mode on 127.0.0.1, with one bucket (`BUCKET`)."""

    scheme = "s3"
    health_path = "/moto-api/"

    def __init__(self, workdir: str, latency_ms: float = 0.0):
        super().__init__(os.path.abspath(__file__), workdir, "--latency-ms", str(latency_ms))

    def create_bucket(self) -> None:
        self.filesystem(allow_bucket_creation=True).create_dir(BUCKET)

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs: the usual AWS variables (dummy credentials)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }

    def filesystem(self, **options):
        from pyarrow import fs

        return fs.S3FileSystem(
            endpoint_override=self.endpoint,
            region="us-east-1",
            access_key="testing",
            secret_key="testing",
            scheme="http",
            **options,
        )


if __name__ == "__main__":
    main()
