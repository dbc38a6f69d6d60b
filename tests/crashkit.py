"""Helpers for the crash-safety tests: a small job, `jobrunner run` as a real subprocess, and the
checks every interrupted run directory must pass (complete files, each row exactly once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

CLI = [sys.executable, "-c", "from jobrunner.cli import main; main()"]
# Columns that must match an uninterrupted run. Not cost_usd (measured time) nor cached_tokens
# (prefix-cache hits depend on which rows ran together).
COMPARED = ("id", "completion", "finish_reason", "prompt_tokens", "completion_tokens", "model")
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "piano",
    "lemon",
    "candle",
    "rocket",
    "garden",
    "mirror",
    "violet",
]


def write_input(path: Path, n: int = 24, bad: bool = True) -> Path:
    """n short prompts; with `bad`, an empty prompt and a malformed line among them."""
    lines = [
        json.dumps(
            {
                "id": f"r{i:02d}",
                "prompt": f"Write one word that rhymes with"
                f" {WORDS[i % len(WORDS)]}{'s' if i >= len(WORDS) else ''}.",
            }
        )
        for i in range(n)
    ]
    if bad:
        lines.insert(3, json.dumps({"id": "bad-empty", "prompt": "   "}))
        lines.insert(9, '{"id": "bad-json", "prompt": ')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_job(dir: Path, engine: str, input_path: Path, out: str = "out", **extra) -> Path:
    job = {
        "name": "crash",
        "model": {"source": "smollm2-135m-instruct", "dtype": "float32", "max_model_len": 128},
        "input": {"path": str(input_path), "use_chat_template": False, "max_error_rate": 0.2},
        "generation": {"max_new_tokens": 6},
        "output": {"path": str(dir / out), "format": "jsonl", "shard_rows": 4},
        "engine": {
            "kind": engine,
            "max_num_seqs": 4,
            "max_batch_tokens": 256,
            "kv_cache_bytes": 16 << 20,
            "num_threads": 1,
        },
    }
    for key, value in extra.items():
        section, _, name = key.partition("__")
        job[section][name] = value
    path = dir / f"{out}.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")  # JSON is YAML
    return path


def env(**extra: str) -> dict[str, str]:
    e = {
        **os.environ,
        "JOBRUNNER_NO_PROGRESS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    e.pop("JOBRUNNER_FAULT_KILL", None)
    e.pop("JOBRUNNER_FAULT_OOM_STEPS", None)
    e.update(extra)
    return e


def run(
    job: Path, *args: str, timeout: float = 600, **extra_env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "run", str(job), *args],
        capture_output=True,
        text=True,
        env=env(**extra_env),
        timeout=timeout,
    )


def start(job: Path, *args: str, **extra_env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, "run", str(job), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(**extra_env),
    )


def wait_for_shards(
    proc: subprocess.Popen, results: Path, more_than: int, timeout: float = 300
) -> int:
    """Block until results/ holds more than `more_than` shards; fail if the run ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = len(list(results.glob("part-*"))) if results.is_dir() else 0
        if n > more_than:
            return n
        if proc.poll() is not None:
            raise AssertionError(
                f"the run ended (rc {proc.returncode}) before shard {more_than + 1}:"
                f"\n{proc.stderr.read()[-3000:]}"
            )
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("no new shard in time")


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def summary(proc_stdout: str) -> dict:
    return json.loads(proc_stdout.strip().splitlines()[-1])


def read_results(out: Path) -> list[dict]:
    rows = []
    for f in sorted((out / "results").glob("part-*")):
        if f.suffix == ".parquet":
            rows += pq.read_table(f).to_pylist()
        else:
            rows += [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines()]
    return rows


def assert_complete_files(out: Path) -> None:
    """Every visible file parses in full: no partial shard, manifest or errors line."""
    read_results(out)
    for name in ("manifest.json", "report.json"):
        if (out / name).exists():
            json.loads((out / name).read_text(encoding="utf-8"))
    if (out / "errors.jsonl").exists():
        for line in (out / "errors.jsonl").read_text(encoding="utf-8").splitlines():
            json.loads(line)


def comparable(out: Path) -> tuple[list[tuple], list[tuple]]:
    """(result rows, error rows), sorted, as the columns that must equal an uninterrupted run."""
    rows = sorted(tuple(r[k] for k in COMPARED) for r in read_results(out))
    errors = []
    if (out / "errors.jsonl").exists():
        for line in (out / "errors.jsonl").read_text(encoding="utf-8").splitlines():
            e = json.loads(line)
            errors.append((e["id"], e["line"], e["code"]))
    return rows, sorted(errors, key=repr)


def assert_each_row_once(out: Path) -> None:
    ids = [r["id"] for r in read_results(out)]
    assert len(ids) == len(set(ids)), (
        f"duplicated rows: {sorted(i for i in ids if ids.count(i) > 1)}"
    )


_REFERENCE: dict[str, tuple[Path, tuple]] = {}


def reference(engine: str) -> tuple[Path, tuple]:
    """An uninterrupted run of the standard job (once per session and engine)."""
    if engine not in _REFERENCE:
        d = Path(tempfile.mkdtemp(prefix=f"jobrunner-ref-{engine}-"))
        job = write_job(d, engine, write_input(d / "in.jsonl"))
        p = run(job)
        assert p.returncode == 0, p.stderr[-3000:]
        _REFERENCE[engine] = (d / "out", comparable(d / "out"))
    return _REFERENCE[engine]


NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def run_as_nobody(args: list[str], home: Path) -> subprocess.CompletedProcess:
    """The CLI with `args` as an unprivileged user (the test skips where it cannot be: not
    root, no setpriv); `home` and the /tmp folders above it are made readable to others."""
    import shutil

    import pytest

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to run the CLI as an unprivileged user")
    for p in [home, *home.parents]:
        if str(p).startswith("/tmp/"):
            p.chmod(p.stat().st_mode | 0o755)
    cmd = [*NOBODY, *CLI, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env(HOME=str(home)), cwd="/")
