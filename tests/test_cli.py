"""The command line a user meets first: exit codes and messages for the usual mistakes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from jobrunner.cli import app
from tests.conftest import write_job


def run_cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    lines = result.stdout.strip().splitlines()
    return result, json.loads(lines[-1]) if lines else None


def test_unknown_executor_exits_78_naming_the_argument(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: x\n")
    result, summary = run_cli("run", job, "--executor", "foo")
    assert result.exit_code == 78
    assert "--executor foo: executor must be one of 'local' or 'ray', got 'foo'" in result.stderr
    assert "Traceback" not in result.stderr
    assert summary["exit_code"] == 78


def test_a_value_of_the_wrong_type_exits_78_naming_line_and_key(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: x\ngeneration:\n  max_new_tokens: true\n")
    result, summary = run_cli("run", job)
    assert result.exit_code == 78 and summary["exit_code"] == 78
    assert summary["error"] == f"{job}:3 generation.max_new_tokens: must be an integer, got true"
    assert not (tmp_path / "out").exists()


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("jobrunner ")


def test_help_has_no_type_tags():
    for cmd in ([], ["run"], ["validate"], ["estimate"], ["report"], ["quantize-check"], ["init"]):
        out = CliRunner().invoke(app, [*cmd, "--help"]).stdout
        assert "<" not in out and "{" not in out, out
        assert "Usage:" in out


def test_validate_prints_a_summary_and_checks_the_output_path(tmp_path):
    (tmp_path / "rows.csv").write_text("id,prompt\n1,hello\n2,hi there\n")
    (tmp_path / "taken").write_text("a file")
    job = write_job(tmp_path / "job.yaml", "input: {path: rows.csv}\noutput: {path: out}\n")
    result, summary = run_cli("validate", job)
    assert result.exit_code == 0
    assert summary["valid"] == 2 and summary["output_state"] == "new"
    assert "2 rows: 2 valid, 0 invalid" in result.stderr
    result, summary = run_cli("validate", job, "--set", f"output.path={tmp_path / 'taken'}")
    assert result.exit_code == 78
    assert "is a file" in summary["error"]


def test_template_field_error_comes_before_the_model_loads(tmp_path, monkeypatch):
    import jobrunner.engine.loader as loader

    monkeypatch.setattr(loader, "load_model", lambda *a: pytest.fail("the model was loaded"))
    (tmp_path / "rows.csv").write_text("id,title,body\n1,a,b\n")
    job = write_job(
        tmp_path / "job.yaml", "input: {path: rows.csv, prompt: {template: '{titel}'}}\n"
    )
    result, summary = run_cli("run", job)
    assert result.exit_code == 78
    assert "template field {titel} is not a column" in result.stderr
    assert result.stderr.count("titel") == 1


def test_init_proposes_ids_and_a_template_and_the_job_loads(tmp_path):
    data = tmp_path / "posts.csv"
    data.write_text("id,title,body\n1,A,first\n2,B,second\n")
    result, summary = run_cli("init", data)
    assert result.exit_code == 0
    job = tmp_path / "posts.yaml"
    assert summary["job"] == str(job)
    from jobrunner.config import load_job

    cfg = load_job(job)
    assert cfg.input.path == str(data)
    assert cfg.input.id_column == "id"
    assert "{title}" in cfg.input.prompt.template and "{body}" in cfg.input.prompt.template
    assert cfg.output.path == str(tmp_path / "out" / "posts")
    assert "# columns found: id, title, body" in job.read_text()
    result, _ = run_cli("init", data)
    assert result.exit_code == 78  # never overwrites without --force
