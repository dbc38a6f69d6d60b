"""The input's identity is its content (issue 21, class 1).

A run directory remembers each input file by its path under the input root and a hash of its
bytes, and each row by a digest; a rerun on changed input is refused (78) naming each file and
row, except `--retry-errors` when only failed rows changed. Most checks drive `open_run` (no
model); the end-to-end ones run the real model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from crashkit import run, summary, write_job

from jobrunner.config import JobConfig
from jobrunner.errors import ResumeMismatch
from jobrunner.io.identity import ROWS_FILE, file_records, input_root
from jobrunner.io.rundir import RunDir
from jobrunner.pipeline import RunOptions
from jobrunner.resume import open_run


def rows(n: int, bad: tuple[int, ...] = ()) -> list[dict]:
    return [
        {"id": f"r{i:02d}", "prompt": "   " if i in bad else f"Say the number {i}."}
        for i in range(n)
    ]


def write(path: Path, recs: list[dict], extra: tuple[str, ...] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + "".join(x + "\n" for x in extra))
    return path


def cfg_for(inp: Path, out: Path) -> JobConfig:
    return JobConfig.model_validate(
        {"input": {"path": str(inp)}, "output": {"path": str(out), "format": "jsonl"}}
    )


def record(row_id: str, reason: str = "stop", cost: float = 0.0) -> dict:
    return {
        "id": row_id,
        "completion": "x",
        "finish_reason": reason,
        "prompt_tokens": 1,
        "cached_tokens": 0,
        "completion_tokens": 1,
        "cost_usd": cost,
        "model": "m",
    }


def start(cfg: JobConfig, committed: list[str], errors=(), **opts) -> tuple[set[str], int]:
    """open_run once, committing `committed` ids as results (and `errors` as RowErrors)."""
    rd = RunDir(cfg.output.path, "jsonl")
    with open_run(rd, cfg, RunOptions(**opts)) as (m, done, total):
        if committed or errors:
            rd.commit(m, [record(i) for i in committed], list(errors))
    return done, total


def test_a_same_size_edit_is_refused_naming_the_file_and_its_rows(tmp_path):
    inp = write(tmp_path / "in.jsonl", rows(6))
    cfg = cfg_for(inp, tmp_path / "out")
    start(cfg, ["r00", "r01"])
    recs = rows(6)
    recs[0]["prompt"] = recs[0]["prompt"].upper()  # same size, other text
    recs[5]["id"] = "x05"  # same size, other id
    size = inp.stat().st_size
    write(inp, recs)
    assert inp.stat().st_size == size
    with pytest.raises(ResumeMismatch) as e:
        start(cfg, [])
    msg = str(e.value)
    assert "in.jsonl: content changed (same size" in msg
    assert "rows changed: 1 ('r00')" in msg
    assert "rows gone: 1 ('r05')" in msg and "rows new: 1 ('x05')" in msg
    assert e.value.exit_code == 78


def test_each_changed_added_and_removed_file_is_named(tmp_path):
    d = tmp_path / "data"
    write(d / "a.jsonl", rows(2))
    write(d / "b.jsonl", [{"id": "b0", "prompt": "hi"}])
    cfg = cfg_for(d, tmp_path / "out")
    start(cfg, ["r00"])
    write(d / "a.jsonl", rows(3))
    (d / "b.jsonl").unlink()
    write(d / "sub" / "c.jsonl", [{"id": "c0", "prompt": "hi"}])
    with pytest.raises(ResumeMismatch) as e:
        start(cfg, [])
    msg = str(e.value)
    assert "a.jsonl: content changed (size " in msg
    assert "b.jsonl: no longer in the input" in msg
    assert "sub/c.jsonl: a new input file" in msg


def test_files_are_named_relative_to_the_input_root_not_the_working_directory(
    tmp_path, monkeypatch
):
    d = tmp_path / "data"
    write(d / "2024" / "part.jsonl", rows(1))
    monkeypatch.chdir(tmp_path)
    here = file_records([str(d / "2024" / "part.jsonl")], input_root(str(d)), None)
    monkeypatch.chdir(d / "2024")
    there = file_records(["part.jsonl"], input_root(str(d)), None)
    assert [r["path"] for r in here] == [r["path"] for r in there] == ["2024/part.jsonl"]
    assert here[0]["blake2b"] == there[0]["blake2b"]


def test_an_unchanged_file_is_not_read_again_and_a_touched_one_is_still_the_same(
    tmp_path, monkeypatch
):
    import jobrunner.io.identity as identity

    inp = write(tmp_path / "in.jsonl", rows(4))
    cfg = cfg_for(inp, tmp_path / "out")
    start(cfg, ["r00"])
    hashed = []
    real = identity.file_digest
    monkeypatch.setattr(identity, "file_digest", lambda p: hashed.append(p) or real(p))
    done, total = start(cfg, [])
    assert (hashed, done, total) == ([], {"r00"}, 4)  # size and mtime matched: no hashing
    os.utime(inp, ns=(1, 1))
    done, _ = start(cfg, [])
    assert len(hashed) == 1 and done == {"r00"}  # hashed again, same content: same job
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["job"]["input"][0]["mtime_ns"] == 1


def test_retry_errors_takes_an_input_whose_only_changes_are_to_failed_rows(tmp_path):
    from jobrunner.types import RowError, RowRef

    recs = rows(4, bad=(2,))
    inp = write(tmp_path / "in.jsonl", recs, ('{"id": "bad-json", "prompt": ',))
    cfg = cfg_for(inp, tmp_path / "out")
    errors = [
        RowError("empty_prompt", "x", RowRef(str(inp), 2, 3), "r02"),
        RowError("malformed_json", "x", RowRef(str(inp), 4, 5)),
    ]
    start(cfg, ["r00", "r01", "r03"], errors)
    recs[2]["prompt"] = "Say two."
    write(inp, recs, ('{"id": "bad-json", "prompt": "Say hi."}',))
    with pytest.raises(ResumeMismatch, match="--retry-errors if only failed rows changed"):
        start(cfg, [])  # without --retry-errors a changed input is refused
    done, total = start(cfg, [], retry_errors=True)
    assert (done, total) == ({"r00", "r01", "r03"}, 5)
    # the fixed input is now the run's input: a plain resume takes it
    assert start(cfg, [])[0] == {"r00", "r01", "r03"}


def test_retry_errors_refuses_an_input_where_a_row_that_succeeded_changed(tmp_path):
    from jobrunner.types import RowError, RowRef

    recs = rows(4, bad=(2,))
    inp = write(tmp_path / "in.jsonl", recs)
    cfg = cfg_for(inp, tmp_path / "out")
    start(cfg, ["r00", "r01", "r03"], [RowError("empty_prompt", "x", RowRef(str(inp), 2), "r02")])
    recs[2]["prompt"] = "Say two."
    recs[1]["prompt"] = "Say one, please."
    write(inp, recs)
    with pytest.raises(ResumeMismatch) as e:
        start(cfg, [], retry_errors=True)
    assert "--retry-errors cannot take it: 1 rows that succeeded changed" in str(e.value)
    assert "'r01'" in str(e.value)
    assert (tmp_path / "out" / "errors.jsonl").stat().st_size > 0  # nothing was forgotten


def test_committed_ids_that_are_not_in_the_input_are_refused(tmp_path):
    inp = write(tmp_path / "in.jsonl", rows(3))
    cfg = cfg_for(inp, tmp_path / "out")
    start(cfg, ["r00", "ghost"])
    with pytest.raises(ResumeMismatch, match=r"1 committed rows whose ids are not in the input"):
        start(cfg, [])


def test_a_manifest_from_before_content_identity_still_resumes(tmp_path):
    inp = write(tmp_path / "in.jsonl", rows(3))
    cfg = cfg_for(inp, tmp_path / "out")
    start(cfg, ["r00"])
    mpath = tmp_path / "out" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["job"]["input"] = [["../somewhere/in.jsonl", inp.stat().st_size]]
    m["fingerprint"]["input"] = "0123456789abcdef"
    m["version"] = 1
    mpath.write_text(json.dumps(m))
    (tmp_path / "out" / ROWS_FILE).unlink()
    assert start(cfg, [])[0] == {"r00"}
    upgraded = json.loads(mpath.read_text())["job"]["input"][0]
    assert upgraded["path"] == "in.jsonl" and len(upgraded["blake2b"]) == 32
    assert (tmp_path / "out" / ROWS_FILE).is_file()


@pytest.mark.slow
def test_the_same_job_resumes_from_another_working_directory(tmp_path):
    inp = write(tmp_path / "in.jsonl", rows(6))
    job = write_job(tmp_path, "paged", inp)
    p = run(job, JOBRUNNER_FAULT_KILL="after_manifest:1")
    assert p.returncode == -9
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    import subprocess

    from crashkit import CLI, env

    p = subprocess.run(
        [*CLI, "run", str(job)], capture_output=True, text=True, env=env(), cwd=elsewhere
    )
    assert p.returncode == 0, p.stderr[-2000:]
    counts = summary(p.stdout)["rows"]
    assert (counts["succeeded"], counts["failed"]) == (6, 0) and counts["skipped"] >= 1


@pytest.mark.slow
def test_fix_the_bad_rows_then_retry_errors_finishes_the_job(tmp_path):
    recs = rows(5, bad=(1,))
    inp = write(tmp_path / "in.jsonl", recs, ('{"id": "bad-json", "prompt": ',))
    job = write_job(tmp_path, "paged", inp, input__max_error_rate=0.5)
    p = run(job)
    assert p.returncode == 0 and summary(p.stdout)["rows"]["failed"] == 2, p.stderr[-2000:]
    recs[1]["prompt"] = "Say one."
    write(inp, recs, ('{"id": "bad-json", "prompt": "Say hi."}',))
    p = run(job, "--retry-errors")
    assert p.returncode == 0, p.stderr[-2000:]
    assert summary(p.stdout)["rows"] == {"succeeded": 6, "failed": 0, "skipped": 4}
