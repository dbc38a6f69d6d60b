"""Shared fixtures: the real built-in model (loaded once), small job files, CPU-friendly env."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from cloudkit import az_container, azurite_server, gcs_server, gs_bucket, store_root  # noqa: F401  (fixtures: local GCS and Azure Blob APIs)
from s3kit import moto_server, moto_server_with_auth, s3_bucket, s3_env  # noqa: F401  (fixtures: a local S3 API server)

os.environ.setdefault("JOBRUNNER_NO_PROGRESS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Device profiles (telemetry.profile) of test runs stay out of the user's cache.
os.environ.setdefault("JOBRUNNER_PROFILE_DIR", tempfile.mkdtemp(prefix="jobrunner-profiles-"))

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "samples"


@pytest.fixture(scope="session")
def model_f32():
    """The real SmolLM2-135M-Instruct in float32 (the correctness oracle's dtype)."""
    from jobrunner.config import ModelConfig
    from jobrunner.engine.loader import load_model

    return load_model(ModelConfig(dtype="float32"))


@pytest.fixture(scope="session")
def tokenizer(model_f32):
    return model_f32.tokenizer


@pytest.fixture(params=["off", "on"])
def amx(request):
    """Each side of the AMX switch this CPU has: off (the kernels' vector paths), and on where
    Linux grants the tiles (skipped elsewhere). The switch covers the bfloat16 linears (steps of
    16 rows or more) and prefill attention alike."""
    from jobrunner.engine.paged import cpu_kernels

    before = cpu_kernels.amx_rows()
    if request.param == "on" and before == 0:
        pytest.skip("no AMX tiles on this CPU")
    cpu_kernels.amx_rows(16 if request.param == "on" else 0)
    yield request.param
    cpu_kernels.amx_rows(before)


def write_job(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
