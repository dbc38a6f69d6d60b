"""The custom_ids an OpenAI batch input has used: exact first lines, in bounded memory."""

import tracemalloc
import uuid

from jobrunner.formats.openai_batch import custom_ids
from jobrunner.formats.openai_batch.custom_ids import FirstLines


def test_every_id_keeps_its_first_line_as_the_table_doubles():
    seen = FirstLines(slots=8)  # doubles about a dozen times below
    ids = [f"req-{i}" for i in range(20_000)]
    for i, cid in enumerate(ids):
        assert seen.take(cid, f"2024/part-{i % 7}.jsonl", i + 1) is None
    assert len(seen) == len(ids)
    for i, cid in enumerate(ids):  # a repeat, from anywhere, names the first line
        assert seen.take(cid, "later.jsonl", 99) == f"2024/part-{i % 7}.jsonl:line {i + 1}"
        assert cid in seen
    assert "req-20000" not in seen and "req-1 " not in seen and "" not in seen
    assert len(seen) == len(ids)  # repeats add nothing


def test_ids_that_differ_only_at_the_end_or_in_unicode_are_different():
    seen = FirstLines()
    for k, cid in enumerate(["a", "a\0", "a ", "é", "e\u0301", "\ud800", "🙂"]):
        assert seen.take(cid, "b.jsonl", k + 1) is None, cid
    assert seen.where("e\u0301") == "b.jsonl:line 5"


def test_an_id_costs_tens_of_bytes_whatever_its_length(monkeypatch):
    """A hundred million lines must not keep a string each (over 150 bytes a UUID id)."""
    monkeypatch.setattr(custom_ids, "GROW_CHUNK", 4096)  # a large table's temporaries, in scale
    n = 200_000
    tracemalloc.start()
    seen = FirstLines()
    for i in range(n):  # each id made here and dropped, as a parsed line's is
        seen.take(str(uuid.UUID(int=i * 7919 + 1)), "batch.jsonl", i + 1)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(seen) == n
    assert held / n < 100, f"{held / n:.0f} bytes an id"  # a dict of the ids: over 150
    assert peak / n < 130, f"{peak / n:.0f} bytes an id at the peak"  # as the table doubles
