"""A run over Parquet files starts before its whole-input pass (resume.start_run): the row count
comes from the footers, and the pass (duplicate ids, strays, row digests) finishes in the
background. Every promise of the pass still holds before anything is committed: duplicate ids
and strays stop the run with nothing committed and the run directory as it was, so the fixed
input then runs as a fresh job."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import JobConfig
from jobrunner.errors import InputDataError, ResumeMismatch
from jobrunner.io.identity import ROWS_FILE
from jobrunner.io.rundir import RunDir
from jobrunner.lifecycle import RunOptions
from jobrunner.resume import start_run

REC = {"completion": "c", "finish_reason": "stop", "prompt_tokens": 1}


@pytest.fixture(autouse=True)
def checked_while_starting(monkeypatch, request):
    """These small inputs take the path of a large one (unless a test says otherwise)."""
    if "small_input" not in request.keywords:
        monkeypatch.setattr("jobrunner.resume.CHECK_WHILE_STARTING_ROWS", 0)


def write_input(path: Path, ids: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "prompt": [f"Say {i}." for i in ids]}), path)
    return path


def config(tmp_path: Path, data: Path) -> JobConfig:
    return JobConfig.model_validate(
        {"input": {"path": str(data)}, "output": {"path": str(tmp_path / "out")}}
    )


def test_duplicates_are_found_after_the_start_and_leave_the_run_directory_unclaimed(tmp_path):
    data = write_input(tmp_path / "in" / "a.parquet", ["a", "b", "a", "c"])
    cfg = config(tmp_path, data)
    rd = RunDir(cfg.output.path, "jsonl")
    with start_run(rd, cfg, RunOptions()) as (m, done, total, check):
        assert total == 4 and len(done) == 0  # from the footer, before the pass
        where = r"(?s)1 duplicate ids .*'a' at .*a\.parquet:row 0, .*:row 2"
        with pytest.raises(InputDataError, match=where):
            check.wait()
    assert not rd.load_manifest().fingerprint  # the manifest names no input yet
    assert not (rd.path / ROWS_FILE).exists()
    write_input(data, ["a", "b", "d", "c"])  # the fixed input is a fresh job, not a changed one
    with start_run(RunDir(cfg.output.path, "jsonl"), cfg, RunOptions()) as (m, _, total, check):
        check.wait()
        assert total == 4 and m.fingerprint
    assert (rd.path / ROWS_FILE).exists()


def test_a_committed_id_the_input_lacks_is_refused_before_the_next_commit(tmp_path):
    data = write_input(tmp_path / "a.parquet", ["a", "b"])
    cfg = config(tmp_path, data)
    rd = RunDir(cfg.output.path, "jsonl")
    with start_run(rd, cfg, RunOptions()) as (m, _, _, check):
        check.wait()
        rd.commit(m, [{"id": i, **REC} for i in ("a", "ghost")], [])
    with start_run(RunDir(cfg.output.path, "jsonl"), cfg, RunOptions()) as (m, done, _, check):
        assert done == {"a", "ghost"}
        with pytest.raises(ResumeMismatch, match=r"1 committed rows .* \('ghost'\)"):
            check.wait()


def cli(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(app, list(args))
    lines = result.stdout.strip().splitlines()
    return result.exit_code, json.loads(lines[-1]) if lines else {}


def test_a_run_over_parquet_with_duplicate_ids_commits_nothing_then_runs_once_fixed(tmp_path):
    data = write_input(tmp_path / "in.parquet", ["r0", "r1", "r0"])
    job = tmp_path / "job.yaml"
    out = tmp_path / "out"
    spec = {
        "input": {"path": str(data)},
        "output": {"path": str(out)},
        "generation": {"max_new_tokens": 2},
    }
    job.write_text(json.dumps(spec))
    code, summary = cli("run", str(job))
    assert code == 65 and summary["error"].startswith("1 duplicate ids in the input")
    assert not list((out / "results").glob("part-*"))  # nothing committed
    write_input(data, ["r0", "r1", "r2"])
    code, summary = cli("run", str(job))
    assert code == 0 and summary["rows"]["succeeded"] == 3
    ids = [r for f in sorted((out / "results").glob("part-*")) for r in pq.read_table(f)["id"]]
    assert sorted(map(str, ids)) == ["r0", "r1", "r2"]


@pytest.mark.parametrize("id_column", ["id", None])
def test_a_resume_reads_only_the_rows_left_a_row_group_at_a_time(tmp_path, id_column):
    from jobrunner.io.ids import IdSet
    from jobrunner.prep.fresh import FreshRows

    data = tmp_path / "a.parquet"
    ids = [f"r{i}" for i in range(7)]
    pq.write_table(pa.table({"id": ids, "prompt": ids}), data, row_group_size=2)
    cfg = JobConfig.model_validate({"input": {"path": str(data), "id_column": id_column}})
    name = (lambda i: f"r{i}") if id_column else (lambda i: f"a.parquet:{i}")
    fresh = FreshRows(cfg, IdSet.of([name(i) for i in (1, 2, 3, 6)]))
    rows = list(fresh)
    assert [(r.values["prompt"], r.source.row) for r in rows] == [("r0", 0), ("r4", 4), ("r5", 5)]
    assert fresh.skipped == 4


@pytest.mark.small_input
def test_a_small_inputs_duplicate_ids_are_refused_before_the_run_starts(tmp_path):
    """Below CHECK_WHILE_STARTING_ROWS the pass runs before start_run yields, so the model is
    never loaded for an input with duplicate ids (promise 9)."""
    data = write_input(tmp_path / "a.parquet", ["a", "b", "a"])
    cfg = config(tmp_path, data)
    rd = RunDir(cfg.output.path, "jsonl")
    with pytest.raises(InputDataError, match="1 duplicate ids"), start_run(rd, cfg, RunOptions()):
        pytest.fail("the run started over an input with duplicate ids")
