"""The native kernel build: flags from JOBRUNNER_KERNEL_CFLAGS reach the compiler and name their
own cached library, so a sanitizer or debug build never serves a run that did not ask for it."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from jobrunner.engine import native_build

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBRUNNER_CACHE", str(tmp_path / "cache"))
    # scripts/asan_kernels.sh sets extra flags: these tests start from none
    monkeypatch.delenv(native_build.EXTRA_FLAGS_ENV, raising=False)
    src = tmp_path / "mark.c"
    src.write_text("#ifndef MARK\n#define MARK 1\n#endif\nint mark(void) { return MARK; }\n")
    return src


def _mark(path) -> int:
    return ctypes.CDLL(str(path)).mark()


def test_extra_flags_reach_the_compiler_and_build_a_library_of_their_own(source, monkeypatch):
    plain = native_build.build_library("mark", [source], [])
    monkeypatch.setenv(native_build.EXTRA_FLAGS_ENV, "-DMARK=7 -O1")
    flagged = native_build.build_library("mark", [source], [])
    assert flagged != plain  # another key: the plain library stays cached as it was
    assert _mark(flagged) == 7
    monkeypatch.delenv(native_build.EXTRA_FLAGS_ENV)
    assert native_build.build_library("mark", [source], []) == plain
    assert _mark(plain) == 1


def test_extra_flags_come_after_ours_so_they_win(monkeypatch):
    monkeypatch.setenv(native_build.EXTRA_FLAGS_ENV, "-O1 -g")
    flags = native_build.compile_flags("x86_64")
    assert flags.index("-O1") > flags.index("-O3") and flags[-1] == "-g"


def test_sources_compile_apart_and_link_into_one_library(source, tmp_path):
    """Each source is compiled on its own (in parallel), then linked: a function of one source
    calls into another, and a source that does not compile fails the build with the compiler's
    words and leaves nothing in the cache."""
    other = tmp_path / "twice.c"
    other.write_text("int mark(void);\nint twice(void) { return 2 * mark(); }\n")
    lib = native_build.build_library("pair", [source, other], [])
    assert ctypes.CDLL(str(lib)).twice() == 2
    broken = tmp_path / "broken.c"
    broken.write_text("int broken(void) { return undeclared_name; }\n")
    with pytest.raises(RuntimeError, match="undeclared_name"):
        native_build.build_library("broken", [source, broken], [])
    assert sorted(p.name for p in lib.parent.iterdir()) == [lib.name]
