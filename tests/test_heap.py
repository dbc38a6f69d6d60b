"""On CPU the heap keeps freed memory (engine/heap.py): a step's large tensors reuse pages."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt"
)

# Faults of a second 256 MB tensor after the first is freed, in a fresh process.
PROBE = """
import resource, sys, torch
from jobrunner.engine import heap
kept = heap.keep_freed_memory() if sys.argv[1] == "keep" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.empty(64 << 20).fill_(1.0)  # 256 MB, freed at once
before = faults()
# a next step's tensor, a little smaller: an aligned request of the same size may not fit the
# freed chunk when something was allocated after it (then it comes from fresh heap)
torch.empty((64 << 20) - 4096).fill_(2.0)
print(kept, faults() - before)
"""


def _second_tensor_faults(mode: str, **env: str) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True, text=True, check=True, env={**os.environ, **env},
    )  # fmt: skip
    kept, faults = done.stdout.split()
    return kept, int(faults)


def _pages() -> int:
    """The faults a fresh 256 MB region takes: one a 4 KiB page, or one a 2 MiB page where
    transparent huge pages are always on (the RHEL default)."""
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        thp = ""
    return (256 << 20) // ((2 << 20) if "[always]" in thp else 4096)


def test_a_freed_step_tensor_is_reused_without_page_faults():
    pages = _pages()
    kept, faults = _second_tensor_faults("keep")
    assert kept == "True" and faults < pages // 20  # its pages were there already
    kept, faults = _second_tensor_faults("as is")  # glibc's default: a fresh mmap each time
    assert kept == "False" and faults > pages // 2


def test_it_can_be_turned_off():
    kept, faults = _second_tensor_faults("keep", JOBRUNNER_KEEP_HEAP="0")
    assert kept == "False" and faults > _pages() // 2
