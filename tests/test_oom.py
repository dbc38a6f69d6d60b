"""Engine faults: out of memory (promise 6) and NaN logits, injected into the real paged engine.

OOM: JOBRUNNER_FAULT_OOM_STEPS (jobrunner/engine/paged/engine.py) raises torch.OutOfMemoryError
at the given forward attempts. NaN: the test poisons one row's logits inside the model runner.
Rows that fail this way are in a result shard (finish_reason error) and in errors.jsonl;
--retry-errors reruns exactly them.
"""

from __future__ import annotations

import json

import pytest
from crashkit import (
    assert_each_row_once,
    comparable,
    read_results,
    reference,
    run,
    write_input,
    write_job,
)
from typer.testing import CliRunner

from jobrunner.cli import app

pytestmark = pytest.mark.slow


def _errors(out) -> list[dict]:
    return [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]


def test_oom_backs_off_and_the_run_completes(tmp_path):
    job = write_job(tmp_path, "paged", write_input(tmp_path / "in.jsonl"))
    out = tmp_path / "out"
    p = run(job, JOBRUNNER_FAULT_OOM_STEPS="3,4")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "retrying with max_num_seqs=2 " in p.stderr  # halved from 4
    assert "retrying with max_num_seqs=1 " in p.stderr
    assert comparable(out) == reference("paged")[1]
    report = json.loads((out / "report.json").read_text())
    assert report["engine_stats"]["oom_retries"] == 2
    assert report["rows"]["succeeded"] == 24


def test_oom_at_the_floor_fails_rows_then_retry_errors_reruns_them(tmp_path):
    job = write_job(tmp_path, "paged", write_input(tmp_path / "in.jsonl"))
    out = tmp_path / "out"
    p = run(job, "--set", "input.max_error_rate=0.9", JOBRUNNER_FAULT_OOM_STEPS="1,2,3,4,5,6")
    assert p.returncode == 0, p.stderr[-2000:]
    failed = {r["id"] for r in read_results(out) if r["finish_reason"] == "error"}
    assert failed, "every attempt down to one short sequence failed: some rows must end as oom"
    assert {e["id"] for e in _errors(out) if e["code"] == "oom"} == failed

    p = run(job, "--retry-errors")
    assert p.returncode == 0, p.stderr[-2000:]
    assert_each_row_once(out)
    assert comparable(out) == reference("paged")[1]  # only the two bad input rows still fail


def test_nan_logits_fail_their_row_only_and_retry_errors_reruns_it(tmp_path, monkeypatch):
    import jobrunner.engine.paged.runner as runner

    monkeypatch.setenv("JOBRUNNER_NO_PROGRESS", "1")
    job = str(write_job(tmp_path, "paged", write_input(tmp_path / "in.jsonl")))
    out = tmp_path / "out"
    real_prepare, real_sample = runner.ModelRunner.prepare, runner.sample
    step = {}

    def prepare(self, batch):
        inputs = real_prepare(self, batch)
        step["ids"] = [batch.seqs[i].request.id for i in inputs.sampling_rows]
        return inputs

    def sample(logits, samplers, *how):  # logits: (R, V), one row per sampling sequence
        logits = logits.clone()  # an inference tensor: a copy can be written
        for row, row_id in enumerate(step["ids"]):
            if row_id == "r05":
                logits[row] = float("nan")
        return real_sample(logits, samplers, *how)

    monkeypatch.setattr(runner.ModelRunner, "prepare", prepare)
    monkeypatch.setattr(runner, "sample", sample)
    r = CliRunner().invoke(app, ["run", job])
    assert r.exit_code == 0, r.output  # 3 of 26 failed: under max_error_rate 0.2
    rows = {x["id"]: x for x in read_results(out)}
    assert rows["r05"]["finish_reason"] == "error"
    assert [e["code"] for e in _errors(out) if e["id"] == "r05"] == ["nan_logits"]
    expected_rows, expected_errors = reference("paged")[1]
    ok_rows, _ = comparable(out)
    assert [x for x in ok_rows if x[0] != "r05"] == [x for x in expected_rows if x[0] != "r05"]

    monkeypatch.setattr(runner.ModelRunner, "prepare", real_prepare)
    monkeypatch.setattr(runner, "sample", real_sample)
    r = CliRunner().invoke(app, ["run", job, "--retry-errors"])
    assert r.exit_code == 0, r.output
    assert_each_row_once(out)
    assert comparable(out) == (expected_rows, expected_errors)
