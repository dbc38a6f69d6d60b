"""Any bad row is a row error, never a job crash (issue 21, class 2).

Generated hostile rows (arbitrary JSON values, lone surrogates, deep nesting, bytes that are
not JSON, every Arrow type in Parquet) go through the whole `jobrunner run` (read, scan,
prepare, commit, reports) with the real tokenizer; only the forward pass is replaced by an
engine that answers each request at once, so each example takes a fraction of a second. Every
row must end in exactly one of results and errors.jsonl, and the exit code is 0 or 65, never 70.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from jobrunner.cli import app


@pytest.fixture(scope="module")
def tokenizer():
    from jobrunner.config import ModelConfig
    from jobrunner.engine.loader import load_tokenizer

    return load_tokenizer(ModelConfig())


@pytest.fixture
def echo_engine(monkeypatch, tokenizer):
    """The pipeline with an engine that answers every request at once (no weights)."""
    import jobrunner.engine.base as base
    import jobrunner.engine.loader as loader
    import jobrunner.engine.start as start
    from jobrunner.engine.resolve import ModelSource
    from jobrunner.types import Choice, FinishReason, Result, Usage

    class Echo(base.Engine):
        kind = "echo"

        def generate(self, requests):
            for r in requests:
                usage = Usage(prompt_tokens=r.num_prompt_tokens, completion_tokens=1)
                choice = Choice(0, "ok", [1], FinishReason.STOP)
                yield Result(r.id, [choice], usage, r.source, r.columns, r.meta)

    def load_model(cfg):
        src = ModelSource("hf_dir", "/nonexistent", "echo")
        return loader.LoadedModel(None, tokenizer, src, "cpu", "float32", "/nonexistent")

    # start_engine's own names (it imported them): patched there, and restored after the test
    monkeypatch.setattr(loader, "load_model", load_model)
    monkeypatch.setattr(start, "prepare_weights", lambda loaded, cfg: {})
    monkeypatch.setattr(start, "check_engine", lambda engine, cfg: None)
    monkeypatch.setattr(start, "make_engine", lambda loaded, cfg: Echo(loaded, cfg))


def run_job(
    tmp: Path, inp: Path, fmt: str = "jsonl", name: str = "", **input_keys
) -> tuple[int, dict, Path]:
    out = tmp / f"out-{fmt}{name}"
    job = {
        "input": {"path": str(inp), "max_error_rate": 1.0, **input_keys},
        "output": {"path": str(out), "format": fmt},
    }
    (tmp / "job.yaml").write_text(json.dumps(job))
    result = CliRunner().invoke(app, ["run", str(tmp / "job.yaml")])
    lines = result.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {}
    return result.exit_code, summary, out


def outcomes(out: Path) -> tuple[list[str], list[dict]]:
    from jobrunner.io.rundir import RunDir

    rd = RunDir(out)
    ids = [i for f in rd.shard_files() for i in _ids(f)]
    return ids, list(rd.iter_errors())


def _ids(f: Path) -> list[str]:
    from jobrunner.io.rundir import read_ids

    return read_ids(f)


def assert_each_row_once(code: int, summary: dict, out: Path, n_rows: int) -> None:
    assert code in (0, 65), summary
    if code == 65 and "duplicate ids" in summary.get("error", ""):
        return  # refused as a whole before any row ran: nothing to account for
    assert code == 0, summary  # max_error_rate is 1.0: only duplicates make a job 65
    ids, errors = outcomes(out)
    failed_ids = [e["id"] for e in errors if e.get("id") is not None]
    assert not set(ids) & set(failed_ids)
    assert len(ids) == len(set(ids))
    assert len(ids) + len(errors) == n_rows, (ids, errors)
    for e in errors:
        assert e["code"] and e["message"] and e["file"]
        assert e["row"] is not None or e["line"] is not None


# ---------------------------------------------------------------- JSON values

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(st.characters(codec=None, exclude_categories=())),  # lone surrogates included
)
json_values = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.dictionaries(st.text(), kids, max_size=3)
    ),
    max_leaves=8,
)
prompts = st.one_of(st.text(max_size=40), json_values)
ids = st.one_of(st.just(None), st.integers(), st.text(max_size=6), json_values)


@st.composite
def jsonl_lines(draw) -> list[str]:
    lines = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["row", "row", "row", "hostile-id", "raw", "deep"]))
        if kind == "raw":
            raw = draw(st.binary(min_size=1, max_size=20)).replace(b"\n", b" ").replace(b"\r", b" ")
            lines.append(raw.decode("latin-1"))
            continue
        if kind == "deep":
            depth = draw(st.integers(900, 3000))
            nest = "[" * depth + "]" * depth
            lines.append(f'{{"id": "deep{i}", "prompt": "x", "v": {nest}}}')
            continue
        row = {"id": f"r{i}", "prompt": draw(prompts)}
        if kind == "hostile-id":
            row["id"] = draw(ids)
        row.update(draw(st.dictionaries(st.sampled_from(["a", "b", "completion"]), json_values)))
        lines.append(json.dumps(row))  # ensure_ascii: a lone surrogate travels as \\udXXX
    return lines


@settings(
    max_examples=12,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking takes minutes here
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(lines=jsonl_lines(), fmt=st.sampled_from(["jsonl", "parquet"]))
def test_hostile_jsonl_rows_each_end_in_results_or_errors(
    echo_engine, tmp_path_factory, lines, fmt
):
    tmp = tmp_path_factory.mktemp("hostile")
    inp = tmp / "in.jsonl"
    inp.write_bytes("\n".join(lines).encode("latin-1", "surrogateescape") + b"\n")
    n_rows = sum(1 for x in inp.read_bytes().split(b"\n") if x.strip())
    code, summary, out = run_job(tmp, inp, fmt)
    assert_each_row_once(code, summary, out, n_rows)


def test_a_first_line_nested_too_deeply_is_that_rows_error(echo_engine, tmp_path):
    # The first line is read once before the run (is this an embeddings batch?): that look
    # must not crash on it either.
    inp = tmp_path / "in.jsonl"
    deep = "[" * 5000 + "]" * 5000
    inp.write_text(f'{{"id": "deep", "prompt": "x", "v": {deep}}}\n{{"id": "ok", "prompt": "y"}}\n')
    code, summary, out = run_job(tmp_path, inp)
    assert_each_row_once(code, summary, out, 2)
    _, errors = outcomes(out)
    assert [e["code"] for e in errors] == ["too_complex"]


@pytest.mark.parametrize("template", ["{prompt:>5d}", "{prompt!r:^12}", "{prompt:.3f}"])
def test_a_value_that_does_not_fit_the_templates_format_spec_is_a_row_error(
    echo_engine, tmp_path, template
):
    inp = tmp_path / "in.jsonl"
    rows = [{"id": "a", "prompt": 7}, {"id": "b", "prompt": "text"}, {"id": "c", "prompt": 1.5}]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, summary, out = run_job(tmp_path, inp, prompt={"template": template})
    assert_each_row_once(code, summary, out, 3)


# ---------------------------------------------------------------- every Arrow type


def arrow_columns():
    import datetime
    import decimal

    import pyarrow as pa

    n = 3
    ts = datetime.datetime(2024, 1, 2, 3, 4, 5)
    cols = {
        "null": pa.array([None] * n, pa.null()),
        "bool": pa.array([True, None, False]),
        "int8": pa.array([1, None, -3], pa.int8()),
        "uint64": pa.array([2**64 - 1, 0, None], pa.uint64()),
        "float16": pa.array([1.5, None, float("nan")], pa.float16()),
        "float64": pa.array([float("inf"), -0.0, None]),
        "decimal": pa.array(
            [decimal.Decimal("1.10"), None, decimal.Decimal("-3")], pa.decimal128(5, 2)
        ),
        "date": pa.array([datetime.date(2024, 1, 1), None, datetime.date(1970, 1, 1)]),
        "time": pa.array([datetime.time(1, 2, 3), None, datetime.time(0)], pa.time64("us")),
        "timestamp": pa.array([ts, None, ts], pa.timestamp("ns")),
        "timestamp_tz": pa.array([ts, ts, None], pa.timestamp("ms", tz="Europe/Paris")),
        "duration": pa.array([1, None, 3], pa.duration("s")),
        "binary": pa.array([b"\x00\xff", None, b""]),
        "fixed_binary": pa.array([b"ab", b"cd", None], pa.binary(2)),
        "large_string": pa.array(["x", None, "\u2028"], pa.large_string()),
        "list": pa.array([[1, 2], None, []]),
        "struct": pa.array([{"a": 1}, None, {"a": None}]),
        "map": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
        "dictionary": pa.array(["a", "b", None]).dictionary_encode(),
    }
    return cols, n


@pytest.mark.parametrize("out_fmt", ["parquet", "jsonl"])
def test_every_arrow_type_as_an_input_column_or_a_prompt(echo_engine, tmp_path, out_fmt):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols, n = arrow_columns()
    table = pa.table(
        {"id": [f"r{i}" for i in range(n)], "prompt": ["Say hi.", None, "Say bye."], **cols}
    )
    pq.write_table(table, tmp_path / "in.parquet")
    code, summary, out = run_job(tmp_path, tmp_path / "in.parquet", out_fmt)
    assert_each_row_once(code, summary, out, n)
    ids, errors = outcomes(out)
    assert sorted(ids) == ["r0", "r2"] and [e["id"] for e in errors] == ["r1"]
    for name in cols:  # every column is a prompt once: a row error each, never a crash
        code, summary, out = run_job(
            tmp_path, tmp_path / "in.parquet", out_fmt, name, prompt={"column": name}
        )
        assert_each_row_once(code, summary, out, n)


def test_a_ragged_csv_row_is_a_row_error_and_the_other_rows_run(echo_engine, tmp_path):
    inp = tmp_path / "in.csv"
    inp.write_bytes(b"id,prompt\n1,ok\n2,a,b\n3,ok")
    code, summary, out = run_job(tmp_path, inp)
    assert code == 0, summary
    ids, errors = outcomes(out)
    assert sorted(ids) == ["1", "3"]
    assert [(e["code"], e["line"], e["message"]) for e in errors] == [
        ("malformed_csv", 3, f"{inp}:line 3: malformed CSV: expected 2 fields, got 3")
    ]
