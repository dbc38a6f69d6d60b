"""A real S3 API on localhost for the object-store tests: moto's server, started per session.

`s3_env` points every store client (and every subprocess a test starts) at it through the
standard AWS_ENDPOINT_URL variable, with throwaway credentials, so the code under test takes the
same path as against AWS S3 or MinIO.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def serving(args: list[str], port: int, what: str, ready=port_open, **popen):
    """A server process (`args`) for the block's length, once `ready(port)` says it answers;
    killed and named if it exits or takes over a minute to start."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)
    deadline = time.monotonic() + 60
    while not ready(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not start on port {port}")
        time.sleep(0.1)
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _http_up(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}", timeout=1)
    except urllib.error.HTTPError:  # up, and refusing the unsigned request
        pass
    except OSError:
        return False
    return True


@pytest.fixture(scope="session")
def moto_server():
    """The endpoint URL of a moto S3 server running for this test session."""
    yield from _moto()


@pytest.fixture(scope="session")
def moto_server_with_auth():
    """A moto S3 server that checks credentials (IAM): unknown keys are refused."""
    yield from _moto(INITIAL_NO_AUTH_ACTION_COUNT="0")


def _moto(**extra_env: str):
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra)")
    pytest.importorskip("s3fs", reason="needs s3fs (the s3 extra)")
    port = free_port()
    args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    env = {**os.environ, **extra_env}
    with serving(args, port, "moto_server", _http_up, env=env):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def s3_env(moto_server, monkeypatch):
    """Env for clients of the moto server; yields a fresh bucket URL (s3://bucket-N)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    from jobrunner.io.fs import filesystem

    bucket = f"bucket-{os.getpid()}-{time.monotonic_ns()}"
    fs, _ = filesystem(f"s3://{bucket}")
    fs.mkdir(bucket)
    yield f"s3://{bucket}"


KEY_ID, SECRET = "AKIAJOBRUNNERTEST", "jobrunner-secret-sentinel"


@pytest.fixture
def s3_bucket(s3_env, monkeypatch, tmp_path):
    """A fresh bucket, distinctive credentials, and a staging directory of this test's own."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("JOBRUNNER_STAGING_DIR", str(tmp_path / "staging"))
    return s3_env


class TcpProxy:
    """A TCP relay to a local port that can be stopped (connections refused, open ones cut)
    and started again on the same port: a store that goes away mid-run and comes back."""

    def __init__(self, target_port: int) -> None:
        self.port, self.target = free_port(), target_port
        self._server: socket.socket | None = None
        self._open: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def stop(self) -> None:
        for s in [self._server, *self._open]:
            _cut(s)
        self._server, self._open = None, []

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_relay, args=(a, b), daemon=True).start()


def _relay(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(1 << 16):
            b.sendall(data)
    except OSError:
        pass
    finally:
        _cut(a)
        _cut(b)


def _cut(s: socket.socket | None) -> None:
    if s is None:
        return
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()
