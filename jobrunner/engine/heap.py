"""Keep freed memory in the process's heap on CPU runs (glibc), so a step's large tensors reuse
pages instead of faulting fresh ones in.

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh mmap and
unmaps it on free, so each engine step's activations (a prefill step of 6,700 tokens: about
195 MB a layer for SmolLM2) arrive as new pages the kernel must fault in and zero: about 30 ms
per 100 MB on a Sapphire Rapids core, a sixth of a bfloat16 prefill step's CPU time. With mmap
off and trimming off (mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD at its largest) the freed blocks
stay in the heap and the next step takes them. The price: the process keeps its peak heap
until it exits (the peak itself is unchanged). Other C libraries, or JOBRUNNER_KEEP_HEAP=0,
leave the allocator as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
_TRIM_NEVER = 2**31 - 1  # an int: the largest threshold mallopt takes


def keep_freed_memory() -> bool:
    """Whether the allocator now keeps freed memory (glibc, not turned off); idempotent."""
    if os.environ.get("JOBRUNNER_KEEP_HEAP", "1") == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        done = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, _TRIM_NEVER) == 1
    except (OSError, AttributeError):
        return False
    if done:
        log.debug("glibc heap: freed memory kept for reuse (mmap and trim off)")
    return done
