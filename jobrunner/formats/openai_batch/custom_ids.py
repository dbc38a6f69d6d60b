"""The custom_ids of a batch input: where each was first used, and the error of a line that
uses one again (a per-line error, never a job failure)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from jobrunner.formats.openai_batch.read import BatchLineError
from jobrunner.prep.prepare import derived_id
from jobrunner.types import RowRef

LINE_BITS = 40  # a first line is one int: its file's index above these bits, its line below
FIRST_SLOTS = 1 << 12
MAX_LOAD = 0.6  # a full table doubles past this share of its slots
HALF = (1 << 64) - 1
GROW_CHUNK = 1 << 20  # entries moved a round when the table doubles


class FirstLines:
    """Each id used so far (a custom_id, an embeddings line's `<custom_id>#<index>`) and the
    line that first used it (its file, named relative to the input root by prepare.place_name,
    and its line), in 40 to 80 bytes an id whatever its length: a batch input of a hundred
    million lines keeps no string a line.

    An id is a 128-bit digest (two keyed SipHash values, Python's own string hash, of the id and
    of the id with a 0 after it), in an open-addressing table of three arrays: the digest's
    halves and the first line. Two different ids sharing a digest is beyond reach (a chance of
    2**-128 a pair, and the hash's key is not known outside the process unless
    PYTHONHASHSEED sets it)."""

    def __init__(self, slots: int = FIRST_SLOTS) -> None:
        self._files: dict[str, int] = {}  # file name -> its index
        self._file: str | None = None  # the last line's file
        self._index = -1  # and its index
        self._used = 0
        self._alloc(slots)

    def __contains__(self, row_id: str) -> bool:
        return self._find(*_digest(row_id))[1] >= 0

    def __len__(self) -> int:
        return self._used

    def take(self, row_id: str, file: str, line: int) -> str | None:
        """Where `row_id` was first used (as `where` says it); None when unused until now, and
        from now on used by `line` of `file`. Once a line: _digest and _find written out here."""
        hi, lo = hash(row_id) & HALF or 1, hash(row_id + "\0") & HALF  # _digest
        his, los, mask = self._hi, self._lo, len(self._hi) - 1
        slot = hi & mask
        while (h := his[slot]) != 0:
            if h == hi and los[slot] == lo:
                return self._place(self._at[slot])
            slot = (slot + 1) & mask
        if file != self._file:
            self._file, self._index = file, self._files.setdefault(file, len(self._files))
        his[slot], los[slot], self._at[slot] = hi, lo, self._index << LINE_BITS | line
        self._used += 1
        if self._used > self._limit:
            del his, los  # the old arrays are freed as the table doubles
            self._grow()
        return None

    def add(self, ids: Iterable[str], file: str, line: int) -> None:
        """`ids` are used by `line` of `file`, unless an earlier line used them first."""
        for row_id in ids:
            self.take(row_id, file, line)

    def where(self, row_id: str) -> str:
        """`2024/a.jsonl:line 7`, as a RowRef names a line."""
        return self._place(self._find(*_digest(row_id))[1])

    def _place(self, first: int) -> str:
        files = list(self._files)  # only on a repeat: an error, never the common path
        return str(RowRef(files[first >> LINE_BITS], 0, first & ((1 << LINE_BITS) - 1)))

    def _find(self, hi: int, lo: int) -> tuple[int, int]:
        """(the id's slot, its first line), or (the free slot it would take, -1)."""
        his, mask = self._hi, len(self._hi) - 1
        slot = hi & mask
        while (h := his[slot]) != 0:
            if h == hi and self._lo[slot] == lo:
                return slot, self._at[slot]
            slot = (slot + 1) & mask
        return slot, -1

    def _alloc(self, slots: int) -> None:
        self._arrays = [np.zeros(slots, np.uint64), np.zeros(slots, np.uint64)]
        self._arrays.append(np.zeros(slots, np.int64))
        # read and written a slot at a time: memoryviews do that for Python ints, fast
        self._hi, self._lo, self._at = (memoryview(a) for a in self._arrays)
        self._limit = int(MAX_LOAD * slots)

    def _grow(self) -> None:
        """Twice the slots, the entries moved into them a chunk at a time (few temporaries)."""
        slots, used = 2 * len(self._hi), self._arrays[0] != 0
        entries = [a[used] for a in self._arrays]
        del self._hi, self._lo, self._at, self._arrays, used  # freed before the new ones
        self._alloc(slots)
        for start in range(0, len(entries[0]), GROW_CHUNK):
            self._insert(*(e[start : start + GROW_CHUNK] for e in entries))

    def _insert(self, hi: np.ndarray, lo: np.ndarray, at: np.ndarray) -> None:
        """Entries absent from the table put in by linear probing, all of them a round: each
        takes its slot when it is free and the entry is the first one there, else tries the
        next slot in the next round."""
        new_hi, new_lo, new_at = self._arrays
        mask = np.uint64(len(new_hi) - 1)
        slot, todo, placed = hi & mask, np.arange(len(hi)), np.zeros(len(hi), bool)
        while len(todo):
            free = todo[new_hi[slot[todo]] == 0]
            _, first = np.unique(slot[free], return_index=True)
            won = free[first]
            new_hi[slot[won]], new_lo[slot[won]], new_at[slot[won]] = hi[won], lo[won], at[won]
            placed[won] = True
            todo = todo[~placed[todo]]
            slot[todo] = (slot[todo] + np.uint64(1)) & mask


def _digest(row_id: str) -> tuple[int, int]:
    """An id's digest as two 64-bit halves; the first never 0 (the table's empty slot)."""
    return hash(row_id) & HALF or 1, hash(row_id + "\0") & HALF


def duplicate_line(raw, cid: str, why: str) -> BatchLineError:
    """A line whose id another line already uses: its error, under the line's derived id."""
    return BatchLineError(
        "duplicate_custom_id",
        f"{raw.source}: {why}",
        raw.source,
        derived_id(raw.source),
        "custom_id",
        custom_id=cid,
    )
