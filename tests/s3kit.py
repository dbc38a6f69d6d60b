"""A real S3 API on localhost for the object-store tests: moto's server, started per session.

`s3_env` points every store client (and every subprocess a test starts) at it through the
standard AWS_ENDPOINT_URL variable, with throwaway credentials, so the code under test takes the
same path as against AWS S3 or MinIO.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_server():
    """The endpoint URL of a moto S3 server running for this test session."""
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra)")
    pytest.importorskip("s3fs", reason="needs s3fs (the s3 extra)")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto_server did not start on port {port}") from None
            time.sleep(0.1)
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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
