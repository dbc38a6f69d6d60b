"""The run directory is ours alone, and finishing is atomic from the outside (issue 21, 3 and 4).

A directory that is not a run's is refused (78) and left byte for byte as it was; damaged or
stray files are named with what to do, never a traceback; `_SUCCESS` is the last file a run
writes and only for exit 0; a rerun of a finished run completes what a crash left undone.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from crashkit import run, summary, write_job

from jobrunner.config import JobConfig, load_job
from jobrunner.errors import ConfigError, RunDirError
from jobrunner.io.rundir import RunDir
from jobrunner.pipeline import RunOptions
from jobrunner.resume import open_run


def write(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def rows(n: int, prompt: str = "Say {i}.") -> list[dict]:
    return [{"id": f"r{i:02d}", "prompt": prompt.format(i=i)} for i in range(n)]


def cfg_for(inp: Path, out: Path, fmt: str = "jsonl") -> JobConfig:
    return JobConfig.model_validate(
        {"input": {"path": str(inp)}, "output": {"path": str(out), "format": fmt}}
    )


def record(row_id: str) -> dict:
    return {
        "id": row_id,
        "completion": "x",
        "finish_reason": "stop",
        "prompt_tokens": 1,
        "cached_tokens": 0,
        "completion_tokens": 1,
        "cost_usd": 0.0,
        "model": "m",
    }


def start(cfg: JobConfig, committed=(), fmt: str = "jsonl", **opts) -> tuple[set[str], int]:
    rd = RunDir(cfg.output.path, fmt)
    with open_run(rd, cfg, RunOptions(**opts)) as (m, done, total):
        if committed:
            rd.commit(m, [record(i) for i in committed], [])
    return done, total


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


FOREIGN = {
    "errors.jsonl": "my own notes\n",
    "results/mine.csv": "a,b\n",
    "results/part-00000.jsonl": json.dumps(record("alien")) + "\n",  # another job's shard
    "notes.txt": "keep me\n",
}


@pytest.mark.parametrize("name", sorted(FOREIGN))
@pytest.mark.parametrize("restart", [False, True])
def test_a_directory_that_is_no_run_is_refused_and_left_as_it_was(tmp_path, name, restart):
    out = tmp_path / "out"
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(FOREIGN[name])
    before = snapshot(out)
    cfg = cfg_for(write(tmp_path / "in.jsonl", rows(2)), out)
    with pytest.raises(RunDirError, match="is not empty and holds no jobrunner run") as e:
        start(cfg, restart=restart)
    assert e.value.exit_code == 78
    assert snapshot(out) == before


def test_a_directory_a_run_left_before_its_first_manifest_is_taken(tmp_path):
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / ".lock").write_text("jobrunner pid 1 on host")
    (out / ".manifest.json.tmp123").write_text("{")
    cfg = cfg_for(write(tmp_path / "in.jsonl", rows(2)), out)
    assert start(cfg) == (set(), 2)


def test_restart_removes_what_runs_write_and_nothing_else(tmp_path):
    out = tmp_path / "out"
    cfg = cfg_for(write(tmp_path / "in.jsonl", rows(2)), out)
    start(cfg, ["r00"])
    (out / "notes.txt").write_text("mine")
    assert start(cfg, restart=True) == (set(), 2)
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("path", ["", "   "])
def test_an_empty_output_path_is_refused(tmp_path, path):
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"output": {"path": path}}))
    with pytest.raises(ConfigError, match="output.path: must name the run directory"):
        load_job(job)


def test_an_output_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "out").write_text("x")
    cfg = cfg_for(write(tmp_path / "in.jsonl", rows(2)), tmp_path / "out")
    with pytest.raises(RunDirError, match="is a file, not a directory"):
        start(cfg)
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        start(cfg_for(tmp_path / "in.jsonl", tmp_path / "f" / "out"))


def test_a_run_directory_inside_the_input_folder_is_not_read_as_input(tmp_path):
    data = tmp_path / "data"
    write(data / "a.jsonl", rows(3))
    for fmt in ("jsonl", "parquet"):
        cfg = cfg_for(data, data / f"out-{fmt}", fmt)
        start(cfg, ["r00"], fmt=fmt)
        (data / f"out-{fmt}" / "telemetry").mkdir(exist_ok=True)
        (data / f"out-{fmt}" / "telemetry" / "steps.parquet").write_bytes(b"")
        assert start(cfg, fmt=fmt) == ({"r00"}, 3)


def damage_manifest_not_json(out: Path) -> str:
    (out / "manifest.json").write_text("{not json")
    return "manifest.json is damaged"


def damage_manifest_a_list(out: Path) -> str:
    (out / "manifest.json").write_text("[]")
    return "manifest.json is damaged"


def damage_truncated_shard(out: Path) -> str:
    shard = next((out / "results").glob("part-*"))
    shard.write_bytes(shard.read_bytes()[:-7])
    return f"{shard.name} does not read"


def damage_stray_backup(out: Path) -> str:
    shard = next((out / "results").glob("part-*"))
    (out / "results" / f"{shard.name}.bak").write_bytes(shard.read_bytes())
    return ".bak is not a shard of this run"


def damage_stray_dir(out: Path) -> str:
    (out / "results" / "old").mkdir()
    return "old is not a shard of this run"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize(
    "damage",
    [
        damage_manifest_not_json,
        damage_manifest_a_list,
        damage_truncated_shard,
        damage_stray_backup,
        damage_stray_dir,
    ],
)
def test_a_damaged_or_stray_file_is_named_with_what_to_do(tmp_path, fmt, damage):
    out = tmp_path / "out"
    cfg = cfg_for(write(tmp_path / "in.jsonl", rows(3)), out, fmt)
    start(cfg, ["r00", "r01"], fmt=fmt)
    expected = damage(out)
    with pytest.raises(RunDirError, match=expected) as e:
        start(cfg, fmt=fmt)
    assert e.value.exit_code == 78
    assert str(out) in str(e.value)
    assert "--restart" in str(e.value) or "move it out" in str(e.value)


def test_no_temporary_file_survives_a_failed_write(tmp_path):
    from jobrunner.io.writers import write_text_atomic

    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(tmp_path / "report.md", "fine\ud800")  # fails mid-write
    assert list(tmp_path.iterdir()) == []


def test_retry_errors_keeps_the_failed_attempts_cost(tmp_path):
    from jobrunner.telemetry.report import build_report
    from jobrunner.types import RowError, RowRef

    rd = RunDir(tmp_path / "out", "jsonl")
    rd.path.mkdir()
    m = rd.prepare()
    failed = {**record("b"), "finish_reason": "error", "cost_usd": 2.0}
    rd.commit(
        m, [{**record("a"), "cost_usd": 1.0}, failed], [RowError("x", "y", RowRef("f", 1), "b")]
    )
    assert build_report(rd).cost.cost_usd == pytest.approx(3.0)
    rd.forget_failed(m)
    assert rd.committed_ids() == {"a"}
    assert build_report(rd).cost.cost_usd == pytest.approx(3.0)
    # a crash between recording the cost and dropping the rows settles on the next prepare
    m = rd.prepare()
    rd.commit(m, [failed], [RowError("x", "y", RowRef("f", 1), "b")])
    m.retiring_cost_usd = rd._failed_cost()
    rd.save_manifest(m)
    rd.prepare()
    assert build_report(rd).cost.cost_usd == pytest.approx(5.0)


# ------------------------------------------------------------- with the real model


@pytest.mark.slow
def test_a_finished_run_rebuilds_missing_reports_and_success_comes_last(tmp_path):
    job = write_job(tmp_path, "paged", write(tmp_path / "in.jsonl", rows(3)))
    out = tmp_path / "out"
    assert run(job).returncode == 0
    files = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}
    assert files["_SUCCESS"] >= max(files.values())  # written last
    for name in ("report.json", "report.md", "report.html"):
        (out / name).unlink()
    p = run(job)
    assert p.returncode == 0, p.stderr[-2000:]
    assert summary(p.stdout)["status"] == "nothing_to_do"
    assert all((out / n).is_file() for n in ("report.json", "report.md", "report.html"))


@pytest.mark.slow
def test_a_job_over_its_error_rate_has_no_success_marker(tmp_path):
    job = write_job(tmp_path, "paged", write(tmp_path / "in.jsonl", rows(3, prompt="  ")))
    out = tmp_path / "out"
    p = run(job)
    assert p.returncode == 65, p.stderr[-2000:]
    assert not (out / "_SUCCESS").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["outcome"]["exit_code"] == 65 and manifest["finished_at"]
    assert json.loads((out / "report.json").read_text())["rows"]["failed"] == 3
    p = run(job)  # answered from the run directory: the same outcome
    assert p.returncode == 65 and not (out / "_SUCCESS").exists()


def mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    return subprocess.run(cmd, capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_full_disk_exits_75_naming_the_path_and_a_rerun_with_space_finishes(tmp_path):
    disk = tmp_path / "disk"
    if not mount_tmpfs(disk, "600k"):
        pytest.skip("needs root and tmpfs to fill a disk")
    try:
        job = write_job(tmp_path, "paged", write(tmp_path / "in.jsonl", rows(6)), out="disk/out")
        p = run(job)
        assert p.returncode == 75, p.stderr[-2000:]
        err = summary(p.stdout)["error"]
        assert "no space left on the device writing" in err and str(disk) in err
        assert not [f for f in disk.rglob("*") if ".tmp" in f.name]
        assert not (disk / "out" / "_SUCCESS").exists()
        subprocess.run(["mount", "-o", "remount,size=50m", str(disk)], check=True)
        p = run(job)
        assert p.returncode == 0, p.stderr[-2000:]
        assert (disk / "out" / "_SUCCESS").exists()
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def finished(tmp_path: Path, fmt: str = "jsonl") -> tuple[RunDir, JobConfig]:
    """A run directory whose three rows were committed one shard each, and marked done."""
    cfg = cfg_for(write(tmp_path / "in.jsonl", rows(3)), tmp_path / "out", fmt)
    rd = RunDir(cfg.output.path, fmt)
    with open_run(rd, cfg, RunOptions()) as (m, _, _):
        for i in ("r00", "r01", "r02"):
            rd.commit(m, [record(i)], [])
        rd.mark_finished(m, 0)
        rd.mark_success(m)
    return rd, cfg


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_finished_run_names_a_shard_changed_or_added_after_it_finished(tmp_path, fmt):
    rd, _ = finished(tmp_path, fmt)
    assert rd.check_finished(rd.load_manifest())
    first, second = rd.shard_files()[:2]
    first.write_bytes(first.read_bytes()[:-3])  # truncated, or edited by hand
    with pytest.raises(RunDirError, match=f"{first.name} changed after it was committed"):
        rd.check_finished(rd.load_manifest())
    first.unlink()  # moved out, as the message says: its rows run again
    assert not rd.check_finished(rd.load_manifest())
    (rd.results / "part-09999.jsonl").write_bytes(second.read_bytes())
    with pytest.raises(RunDirError, match="part-09999.jsonl is not a shard this finished run"):
        rd.check_finished(rd.load_manifest())


def test_a_finished_runs_rerun_after_a_shard_is_moved_out_runs_its_rows_again(tmp_path):
    from jobrunner.lifecycle import answer_finished

    rd, cfg = finished(tmp_path)
    assert answer_finished(rd, cfg, RunOptions()) is not None  # done: answered at once
    rd.shard_files()[1].unlink()
    assert answer_finished(rd, cfg, RunOptions()) is None  # the pipeline runs the lost rows
    assert not rd.success_marked
    done, total = start(cfg)
    assert total == 3 and done == {"r00", "r02"}


def test_success_beside_shards_without_a_manifest_is_not_this_jobs(tmp_path):
    from jobrunner.lifecycle import answer_finished

    rd, cfg = finished(tmp_path)
    rd.manifest_path.unlink()  # the shards and _SUCCESS of some job, its manifest gone
    before = {p.name: p.read_bytes() for p in rd.results.iterdir()}
    with pytest.raises(RunDirError, match="holds no jobrunner run") as e:
        answer_finished(rd, cfg, RunOptions())
    assert e.value.exit_code == 78
    assert {p.name: p.read_bytes() for p in rd.results.iterdir()} == before
