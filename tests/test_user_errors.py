"""User errors are never "internal errors" (issue 21, class 6).

Exit 70 is a bug in jobrunner and nothing else: a path we may not write, a file where a
directory should be, a refused job setting or a full disk exit 78 or 75 with the path and the
fix; the stdout summary carries the whole message.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from crashkit import CLI, env
from typer.testing import CliRunner

from jobrunner import errors
from jobrunner.cli import app


def cli(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(app, list(args))
    lines = result.stdout.strip().splitlines()
    return result.exit_code, json.loads(lines[-1]) if lines else {}


def job_file(tmp_path: Path, recs: list[dict], **sections) -> Path:
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in recs))
    job = {"input": {"path": str(inp)}, "output": {"path": str(tmp_path / "out")}}
    for k, v in sections.items():
        job.setdefault(k, {}).update(v)
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job))
    return path


@pytest.mark.parametrize(
    "err, code, words",
    [
        (OSError(errno.ENOSPC, "No space left on device", "/data/out/x"), 75, "/data/out/x"),
        (OSError("[errno 28] error writing /data/out/part.parquet"), 75, "no space left"),
        (OSError(errno.EROFS, "Read-only file system", "/ro/out"), 78, "read-only file system"),
        (PermissionError(errno.EACCES, "Permission denied", "/root/x"), 78, "permission denied"),
    ],
)
def test_the_environments_os_errors_become_user_errors(err, code, words):
    user = errors.from_os_error(err)
    assert user is not None and user.exit_code == code and words in str(user)


def test_other_errors_stay_internal():
    assert errors.from_os_error(OSError(errno.ENOENT, "No such file", "/x")) is None
    assert errors.from_os_error(ValueError("bug")) is None


def test_report_on_a_directory_that_is_no_run_is_78_with_the_path(tmp_path):
    for where in (tmp_path, tmp_path / "missing"):
        code, summary = cli("report", str(where))
        assert code == 78 and str(where) in summary["error"]
        assert "is not a jobrunner run directory" in summary["error"]


def test_a_refused_template_field_is_a_configuration_error(tmp_path):
    job = job_file(tmp_path, [{"id": "a", "prompt": "x"}], input={"prompt": {"template": "{a.b}"}})
    code, summary = cli("run", str(job))
    assert code == 78
    # the job file first, then the key and what is wrong with it
    assert summary["error"].startswith(f"{job}: input.prompt.template: template field {{a.b}}")


def test_the_summary_holds_the_whole_message(tmp_path):
    recs = [{"id": f"r{i}", "prompt": "x"} for i in range(3)] * 2
    code, summary = cli("run", str(job_file(tmp_path, recs)))
    assert code == 65
    lines = summary["error"].splitlines()
    assert lines[0] == "3 duplicate ids in the input (ids must be unique):"
    assert len(lines) == 4 and all("in.jsonl:line" in x for x in lines[1:])


def test_an_internal_error_is_summarised_by_type_and_message(monkeypatch, tmp_path):
    import jobrunner.executors as executors

    def broken(cfg, opts):
        raise ValueError(b"\xff\xfe".decode("latin-1"))

    monkeypatch.setattr(executors, "run_with_executor", broken)
    code, summary = cli("run", str(job_file(tmp_path, [{"id": "a", "prompt": "x"}])))
    assert code == 70 and summary["error"] == "internal error: ValueError: \xff\xfe"


def test_an_unwritable_cache_falls_back_before_anything_is_computed(tmp_path, monkeypatch):
    import tempfile

    from jobrunner.engine import resolve

    monkeypatch.setenv("JOBRUNNER_CACHE", "/proc/jobrunner-cache")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert resolve.writable_cache_dir() == tmp_path / f"jobrunner-cache-{os.getuid()}"
    monkeypatch.setattr(tempfile, "tempdir", "/proc")
    with pytest.raises(errors.ConfigError, match="set \\$JOBRUNNER_CACHE"):
        resolve.writable_cache_dir()


def test_a_dequantize_that_fails_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    from jobrunner.engine import loader
    from jobrunner.engine.resolve import ModelSource

    target = tmp_path / "gguf" / "abc-v2"
    stale = tmp_path / "gguf" / "abc-v2.tmp999999999"  # a process killed with -9
    stale.mkdir(parents=True)

    class Boom(Exception):
        pass

    def fail(*a, **k):
        raise Boom

    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(Boom):
        loader._dequantize_gguf(ModelSource("gguf", str(tmp_path), "m", "m.gguf"), target)
    assert list((tmp_path / "gguf").iterdir()) == []


def as_nobody() -> list[str] | None:
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return None
    return ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def test_an_output_directory_we_may_not_write_is_78_with_the_path(tmp_path):
    prefix = as_nobody()
    if prefix is None:
        pytest.skip("needs root to run the CLI as an unprivileged user")
    tmp_path.chmod(0o755)
    for p in tmp_path.parents:
        if str(p).startswith("/tmp/"):
            p.chmod(p.stat().st_mode | 0o755)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)
    job = job_file(tmp_path, [{"id": "a", "prompt": "x"}])
    data = json.loads(job.read_text())
    data["output"]["path"] = str(locked / "out")
    job.write_text(json.dumps(data))
    for f in (job, tmp_path / "in.jsonl"):
        f.chmod(0o644)
    p = subprocess.run(
        [*prefix, *CLI, "run", str(job)],
        capture_output=True,
        text=True,
        env=env(HOME=str(tmp_path)),
        cwd="/",
    )
    assert p.returncode == 78, p.stderr[-2000:]
    err = json.loads(p.stdout.strip().splitlines()[-1])["error"]
    assert str(locked / "out") in err and "permission denied" in err
