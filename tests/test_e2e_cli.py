"""End to end through the CLI on the real model: rows in equal rows out, report equals rows."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jobrunner.cli import app
from tests.conftest import write_job

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is a tuple?",
    "Name a prime number.",
    "What does HTTP stand for?",
    "Say hello in French.",
    "What is 3 times 4?",
    "Give a synonym for fast.",
    "What colour is grass?",
    "Spell the word cat backwards.",
]


def run_cli(*args):
    result = CliRunner().invoke(app, list(args))
    summary = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
    return result.exit_code, summary


@pytest.fixture
def chat_job(tmp_path):
    """A chat-messages dataset of the user's own (not the samples), as JSONL."""
    data = tmp_path / "mine.jsonl"
    with open(data, "w") as f:
        for i, q in enumerate(QUESTIONS):
            f.write(
                json.dumps(
                    {"qid": f"q-{i}", "lang": "en", "messages": [{"role": "user", "content": q}]}
                )
                + "\n"
            )
    return write_job(
        tmp_path / "job.yaml",
        f"""
name: mine
model: {{source: smollm2-135m-instruct, dtype: float32, max_model_len: 1024}}
input:
  path: {data}
  id_column: qid
  prompt: {{messages_column: messages}}
generation: {{max_new_tokens: 8}}
output: {{path: {tmp_path / "out"}, format: parquet, shard_rows: 3}}
""",
    )


def test_chat_job_every_row_once_and_report_matches_rows(chat_job, tmp_path):
    from jobrunner.engine.start import LOAD_PARTS

    code, summary = run_cli("run", str(chat_job))
    assert code == 0
    assert summary["status"] == "done"
    assert summary["rows"] == {"succeeded": 8, "failed": 0, "skipped": 0}
    out = tmp_path / "out"
    rows = pq.read_table(out / "results").to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(f"q-{i}" for i in range(8))
    assert set(rows[0]) >= {
        "lang",
        "messages",
        "id",
        "completion",
        "finish_reason",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "cost_usd",
        "model",
    }
    assert all(r["completion"] and r["completion_tokens"] > 0 for r in rows)
    assert all(r["finish_reason"] in ("stop", "length") for r in rows)
    report = json.loads((out / "report.json").read_text())
    assert report["tokens"]["prompt"] == sum(r["prompt_tokens"] for r in rows)
    assert report["tokens"]["completion"] == sum(r["completion_tokens"] for r in rows)
    assert report["cost"]["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows))
    assert report["cost"]["cost_usd"] > 0
    assert summary["cost_usd"] == pytest.approx(report["cost"]["cost_usd"], abs=1e-8)
    assert (out / "_SUCCESS").exists() and (out / "report.md").exists()
    run = json.loads((out / "manifest.json").read_text())["runs"][-1]
    assert set(run["load_parts"]) == set(LOAD_PARTS)  # the start-up the bench prints
    assert sum(run["load_parts"].values()) == pytest.approx(run["load_seconds"])
    assert run["before_load_seconds"] > 0


def test_finished_job_rerun_does_nothing(chat_job, tmp_path):
    assert run_cli("run", str(chat_job))[0] == 0
    before = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    code, summary = run_cli("run", str(chat_job))
    assert (code, summary["status"]) == (0, "nothing_to_do")
    assert summary["rows"]["skipped"] == summary["rows"]["succeeded"] + summary["rows"]["failed"]
    after = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert after == before


def test_static_engine_text_column_jsonl_output(tmp_path):
    data = tmp_path / "in.csv"
    data.write_text("prompt\n" + "\n".join(QUESTIONS[:4]) + "\n")
    job = write_job(
        tmp_path / "job.yaml",
        f"""
model: {{dtype: float32}}
input: {{path: {data}}}
generation: {{max_new_tokens: 6}}
output: {{path: {tmp_path / "o"}, format: jsonl}}
engine: {{kind: static}}
""",
    )
    code, summary = run_cli("run", str(job))
    assert code == 0 and summary["rows"]["succeeded"] == 4
    lines = [
        json.loads(x)
        for f in sorted((tmp_path / "o" / "results").iterdir())
        for x in f.read_text().splitlines()
    ]
    assert sorted(r["id"] for r in lines) == [f"in.csv:{i}" for i in range(4)]


def test_bad_config_exits_78_before_loading(tmp_path):
    job = write_job(tmp_path / "job.yaml", "generation: {temperature: -2}\n")
    code, summary = run_cli("run", str(job))
    assert code == 78
    assert summary["status"] == "error" and "generation.temperature" in summary["error"]


def test_unknown_model_exits_78(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text('{"id": 1, "prompt": "x"}\n')
    job = write_job(
        tmp_path / "job.yaml",
        f"model: {{source: no-such-model}}\ninput: {{path: {data}}}\noutput: {{path: {tmp_path / 'o'}}}\n",
    )
    assert run_cli("run", str(job))[0] == 78


def test_validate_counts_rows_without_weights(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text(
        '{"id": 1, "prompt": "hello"}\n{"id": 2, "prompt": ""}\n{"id": 3, "prompt": "bye"}\n'
    )
    job = write_job(tmp_path / "job.yaml", f"input: {{path: {data}, max_error_rate: 0.5}}\n")
    code, summary = run_cli("validate", str(job))
    assert code == 0
    assert (summary["rows"], summary["valid"], summary["errors_by_code"]) == (
        3,
        2,
        {"empty_prompt": 1},
    )
    code, _ = run_cli("validate", str(job), "--set", "input.max_error_rate=0.1")
    assert code == 65


def test_init_writes_a_job_that_runs_as_is_from_any_folder(tmp_path, monkeypatch):
    data = tmp_path / "data" / "posts.csv"
    data.parent.mkdir()
    data.write_text(
        "id,title,body\n"
        'a1,Tea,"Green tea has less caffeine than coffee."\n'
        'a2,Rain,"It rained all day in the valley."\n'
    )
    code, summary = run_cli("init", str(data))
    assert code == 0
    monkeypatch.chdir("/")  # relative paths in the job file resolve against its own folder
    code, summary = run_cli("run", summary["job"])
    assert code == 0, summary
    assert summary["rows"]["succeeded"] == 2
    rows = pq.read_table(tmp_path / "data" / "out" / "posts" / "results").to_pylist()
    assert sorted(r["id"] for r in rows) == ["a1", "a2"]
    assert all(r["completion"] and r["title"] for r in rows)
