"""How the linear kernels share a step's rows among threads (csrc/row_chunks.h): each row
block computed exactly once whatever order the threads claim in, a thread that keeps pace
working only through its own share, and a stalled thread's rows taken by the others. The header
is built into tests/row_chunks_check.c with the C compiler the kernels use and run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jobrunner.engine.paged import cpu_kernels

CSRC = Path(cpu_kernels.__file__).with_name("csrc")
CHECK = Path(__file__).with_name("row_chunks_check.c")
CC = os.environ.get("CC", "cc")  # as engine/native_build.py picks it


@pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler")
def test_every_row_block_is_claimed_once_and_a_stalled_threads_rows_are_taken(tmp_path):
    exe = tmp_path / "row_chunks_check"
    subprocess.run(
        [CC, "-O2", "-fopenmp", f"-I{CSRC}", str(CHECK), "-o", str(exe)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    env = {**os.environ, "OMP_NUM_THREADS": "4"}
    done = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
