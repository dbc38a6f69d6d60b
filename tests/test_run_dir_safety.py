"""The run directory's promises against a hostile user (DESIGN.md promises 3, 11, 12).

A changed output shape is a changed job; `estimate` and `validate` take output.path only where
`run` would; --restart removes only what runs wrote; a run directory never goes inside another.
Run directories are made by `open_run` and commits (no model); the commands go through the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from crashkit import run
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import load_job
from jobrunner.errors import ResumeMismatch
from jobrunner.io.rundir import RunDir
from jobrunner.pipeline import RunOptions
from jobrunner.resume import open_run


def job_file(d: Path, out: str = "out", name: str = "job.yaml", **output) -> Path:
    """A tiny job over three rows (a jsonl input beside it)."""
    inp = d / "in.jsonl"
    if not inp.exists():
        inp.write_text(
            "".join(json.dumps({"id": f"r{i}", "prompt": f"Say {i}."}) + "\n" for i in range(3))
        )
    job = {
        "model": {"dtype": "float32", "max_model_len": 128},
        "input": {"path": "in.jsonl", "use_chat_template": False},
        "generation": {"max_new_tokens": 2},
        "output": {"path": out, "shard_rows": 1, **output},
        "engine": {"kind": "static", "num_threads": 1},
    }
    path = d / name
    path.write_text(json.dumps(job))
    return path


def record(row_id: str) -> dict:
    return {"id": row_id, "prompt": "p", "completion": "x", "finish_reason": "stop",
            "prompt_tokens": 1, "cached_tokens": 0, "completion_tokens": 1, "cost_usd": 0.0,
            "model": "m"}  # fmt: skip


def make_run(job: Path, ids=("r0", "r1"), finish: bool = False, *overrides: str) -> RunDir:
    """The job's run directory with `ids` committed one shard each (finished if asked)."""
    cfg = load_job(job, list(overrides))
    rd = RunDir(cfg.output.path, cfg.output.format)
    with open_run(rd, cfg, RunOptions()) as (m, _, _):
        for i in ids:
            rd.commit(m, [record(i)], [])
        if finish:
            rd.mark_success(m)
    return rd


def snapshot(d: Path) -> dict[str, bytes]:
    """Every file's bytes but the lock's (each invocation writes its pid there)."""
    files = (p for p in sorted(d.rglob("*")) if p.is_file() and p.name != ".lock")
    return {str(p.relative_to(d)): p.read_bytes() for p in files}


def cli(*args: str):
    r = CliRunner().invoke(app, list(args))
    lines = r.stdout.strip().splitlines()
    return r, (json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {})


# ------------------------------------------------------------ the output's shape is the job's


@pytest.mark.parametrize("finish", [False, True])
@pytest.mark.parametrize(
    "change, line",
    [
        ("output.format=jsonl", "output.format: 'parquet' -> 'jsonl'"),
        ("output.keep_input_columns=false", "output.keep_input_columns: True -> False"),
    ],
)
def test_a_changed_output_shape_is_a_changed_job(tmp_path, finish, change, line):
    rd = make_run(job_file(tmp_path), finish=finish)
    before = snapshot(rd.path)
    r, out = cli("run", str(tmp_path / "job.yaml"), "--set", change)
    assert r.exit_code == 78, r.output
    assert "holds a different job" in out["error"] and line in out["error"]
    assert snapshot(rd.path) == before


def test_output_keys_that_do_not_change_results_stay_changeable(tmp_path):
    rd = make_run(job_file(tmp_path), ids=("r0", "r1", "r2"), finish=True)
    for change in ("output.shard_rows=7", "output.shard_seconds=3"):
        r, out = cli("run", str(tmp_path / "job.yaml"), "--set", change)
        assert r.exit_code == 0, r.output
        assert out["status"] == "nothing_to_do"
    moved = tmp_path / "moved"
    rd.path.rename(moved)  # the run directory moved: the same job at its new path
    r, out = cli("run", str(tmp_path / "job.yaml"), "--set", f"output.path={moved}")
    assert r.exit_code == 0 and out["status"] == "nothing_to_do", r.output


def test_a_manifest_from_before_output_settings_is_held_to_its_shards(tmp_path):
    rd = make_run(job_file(tmp_path))
    m = json.loads(rd.manifest_path.read_text())
    for d in (m["fingerprint"], m["job"]):
        del d["output"]  # as runs wrote it before the output settings were fingerprinted
    rd.manifest_path.write_text(json.dumps(m))
    cfg = load_job(tmp_path / "job.yaml", ["output.format=jsonl"])
    with (
        pytest.raises(ResumeMismatch, match="output.format: results/ holds .parquet shards"),
        open_run(RunDir(cfg.output.path, "jsonl"), cfg, RunOptions()),
    ):
        pass
    cfg = load_job(tmp_path / "job.yaml")
    with open_run(RunDir(cfg.output.path), cfg, RunOptions()) as (m, done, _):
        assert done == {"r0", "r1"} and m.job["output"]["format"] == "parquet"


@pytest.mark.slow
def test_a_format_changed_after_a_crash_is_refused_and_the_run_still_reads(tmp_path):
    job = job_file(tmp_path)
    out = tmp_path / "out"
    p = run(job, JOBRUNNER_FAULT_KILL="after_manifest:2")  # kill -9 after 2 committed shards
    assert p.returncode == -9, p.stderr[-2000:]
    before = snapshot(out / "results")
    for change in ("output.format=jsonl", "output.keep_input_columns=false"):
        p = run(job, "--set", change)
        assert p.returncode == 78, p.stderr[-2000:]
        assert snapshot(out / "results") == before
    p = run(job)
    assert p.returncode == 0, p.stderr[-2000:]
    assert pq.read_table(out / "results").num_rows == 3
    assert {s.suffix for s in (out / "results").iterdir()} == {".parquet"}


# ------------------------------------------------------------------------------- estimate


def test_estimate_leaves_a_users_folder_and_another_jobs_run_untouched(tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "estimate.json").write_text("my own estimate")
    (user / "notes.txt").write_text("keep me")
    job = job_file(tmp_path)
    rd = make_run(job, ids=("r0", "r1", "r2"), finish=True)
    for target, why in ((user, "holds no jobrunner run"), (rd.path, "holds a different job")):
        before = snapshot(target)
        overrides = ["--set", f"output.path={target}", "--set", "generation.max_new_tokens=3"]
        r, out = cli("estimate", str(job), *overrides)
        assert r.exit_code == 0, r.output
        assert out["estimate"] is None and why in out["not_written"]
        assert "estimate.json not written" in r.output
        assert snapshot(target) == before
    r, out = cli("estimate", str(job))  # the run's own job: written beside it
    assert r.exit_code == 0 and out["estimate"] == str(rd.path / "estimate.json"), r.output


# -------------------------------------------------------------------------------- restart


@pytest.mark.parametrize(
    "name", ["results/notes.txt", "results/part-99999.parquet.bak", "telemetry/mine.csv"]
)
def test_restart_refuses_a_users_file_among_the_runs_and_removes_nothing(tmp_path, name):
    rd = make_run(job_file(tmp_path))
    (rd.path / name).parent.mkdir(exist_ok=True)
    (rd.path / name).write_text("mine")
    before = snapshot(rd.path)
    r, out = cli("run", str(tmp_path / "job.yaml"), "--restart")
    assert r.exit_code == 78, r.output
    assert str(rd.path / name) in out["error"] and "move it out of" in out["error"]
    assert snapshot(rd.path) == before


def test_restart_removes_the_earlier_jobs_estimate(tmp_path):
    rd = make_run(job_file(tmp_path))
    (rd.path / "estimate.json").write_text("{}")  # the earlier job's
    changed = load_job(tmp_path / "job.yaml", ["generation.max_new_tokens=3"])
    with open_run(RunDir(changed.output.path), changed, RunOptions(restart=True)) as (_, done, _):
        assert not done
    assert not (rd.path / "estimate.json").exists()


def test_restart_with_retry_errors_is_a_usage_error(tmp_path):
    rd = make_run(job_file(tmp_path))
    before = snapshot(rd.path)
    r, _ = cli("run", str(tmp_path / "job.yaml"), "--restart", "--retry-errors")
    assert r.exit_code == 2, r.output
    assert "give one of them" in r.output
    assert snapshot(rd.path) == before


# ----------------------------------------------------------------- a run inside another run


@pytest.mark.parametrize("inside", ["out/results/sub", "out/sub", "out/telemetry/deep/er"])
@pytest.mark.parametrize("command", ["run", "validate", "estimate"])
def test_an_output_path_inside_another_run_is_refused(tmp_path, inside, command):
    rd = make_run(job_file(tmp_path), ids=("r0", "r1", "r2"), finish=True)
    before = snapshot(rd.path)
    other = job_file(tmp_path, out=inside, name="other.yaml")
    r, out = cli(command, str(other), "--set", "generation.max_new_tokens=3")
    if command == "estimate":  # an estimate is still given, not written there
        assert r.exit_code == 0 and out["estimate"] is None, r.output
        error = out["not_written"]
    else:
        assert r.exit_code == 78, r.output
        error = out["error"]
    assert f"is inside the run directory {rd.path}" in error
    assert snapshot(rd.path) == before and not (tmp_path / inside).exists()
    r, out = cli("run", str(tmp_path / "job.yaml"))  # the run still answers as finished
    assert r.exit_code == 0 and out["status"] == "nothing_to_do", r.output
    assert pq.read_table(rd.results).num_rows == 3


def test_a_run_below_the_output_path_keeps_it_refused(tmp_path):
    make_run(job_file(tmp_path, out="outer/inner"), ids=("r0",))
    r, out = cli("run", str(job_file(tmp_path, out="outer", name="outer.yaml")))
    assert (
        r.exit_code == 78
        and "holds no jobrunner run (no manifest.json; found inner)" in out["error"]
    )


# ------------------------------------------------------------------ validate answers as run


@pytest.mark.parametrize("out", ["mine", "."])
def test_validate_refuses_what_run_refuses(tmp_path, out):
    job = job_file(tmp_path, out=out)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    before = snapshot(tmp_path)
    for command in ("validate", "run"):
        r, res = cli(command, str(job))
        assert r.exit_code == 78, r.output
        assert "is not empty and holds no jobrunner run" in res["error"]
    assert snapshot(tmp_path) == before


def test_validate_names_a_changed_output_format(tmp_path):
    make_run(job_file(tmp_path))
    r, out = cli("validate", str(tmp_path / "job.yaml"), "--set", "output.format=jsonl")
    assert r.exit_code == 78 and "output.format: 'parquet' -> 'jsonl'" in out["error"], r.output
