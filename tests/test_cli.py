"""The command line a user meets first: exit codes and messages for the usual mistakes."""

from __future__ import annotations

import json

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
