"""Work ordering: shared heads together, long and short alternate, bounded memory."""

from __future__ import annotations

from jobrunner.prep.order import HEAD_TOKENS, order_requests
from jobrunner.types import Request, SamplingParams


def req(rid: str, tokens: list[int], priority: int = 0) -> Request:
    return Request(rid, tokens, SamplingParams(), priority=priority)


HEAD_A = [1] * HEAD_TOKENS
HEAD_B = [2] * HEAD_TOKENS


def ids(rows) -> list[str]:
    return [r.id for r in rows]


def test_shared_heads_come_together():
    rows = [
        req("a1", HEAD_A + [5]),
        req("x", [9, 9]),
        req("b1", HEAD_B + [5]),
        req("a2", HEAD_A + [6]),
        req("b2", HEAD_B + [4]),
    ]
    out = ids(order_requests(rows, window=10))
    assert sorted(out) == sorted(ids(rows))
    assert abs(out.index("a1") - out.index("a2")) == 1
    assert abs(out.index("b1") - out.index("b2")) == 1


def test_long_and_short_runs_alternate():
    rows = [req(f"r{n}", [n] * n) for n in (1, 2, 3, 4, 5, 6)]
    assert ids(order_requests(rows, window=6)) == ["r6", "r1", "r5", "r2", "r4", "r3"]


def test_window_bounds_reordering_and_memory():
    pulled = []

    def stream():
        for n in range(6):
            pulled.append(n)
            yield req(f"r{n}", [10 - n])

    it = order_requests(stream(), window=3)
    first = next(it)
    assert pulled == [0, 1, 2]  # only one window was read
    assert first.id in {"r0", "r1", "r2"}
    rest = [first.id] + ids(it)
    assert set(rest[:3]) == {"r0", "r1", "r2"} and set(rest[3:]) == {"r3", "r4", "r5"}


def test_higher_priority_first_within_window():
    rows = [req("low", [1]), req("high", [2], priority=5), req("mid", [3], priority=1)]
    assert ids(order_requests(rows, window=3)) == ["high", "mid", "low"]
