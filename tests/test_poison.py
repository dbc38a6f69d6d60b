"""A poison input: every kind of bad row among good ones (promises 4 and 5).

Every good row must succeed, every bad row must be in errors.jsonl with its line number and code,
and the exit code must follow input.max_error_rate, also when a finished job is run again.
"""

from __future__ import annotations

import json

import pytest
from crashkit import read_results
from typer.testing import CliRunner

from jobrunner.cli import app

pytestmark = pytest.mark.slow

GOOD = {1: "g1", 3: "g2", 6: "g3", 12: "g4", 16: "g5", 17: "g6"}
# line -> (line bytes, expected error code, id recorded in errors.jsonl)
BAD = {
    2: (b'{"id": "e-empty", "prompt": ""}', "empty_prompt", "e-empty"),
    4: (b'{"id": "e-space", "prompt": "  \\t  "}', "empty_prompt", "e-space"),
    5: (json.dumps({"id": "e-long", "prompt": "tiger " * 90}).encode(), "too_long", "e-long"),
    7: (b'{"id": "e-ptype", "prompt": 42}', "bad_type", "e-ptype"),
    8: (b'{"id": ["x"], "prompt": "hello"}', "bad_type", None),
    9: (b'{"id": null, "prompt": "hello"}', "missing_id", None),
    10: (b'{"prompt": "hello there"}', "missing_id", None),
    11: (b'{"id": "e-noprompt", "text": "hello"}', "missing_field", "e-noprompt"),
    13: (b"[1, 2, 3]", "not_an_object", None),
    14: (b'{"id": "e-json", "prompt": ', "malformed_json", None),
    15: (b'{"id": "e-utf8", "prompt": "caf\xe9 au lait"}', "invalid_utf8", None),
    18: (b'"just a string"', "not_an_object", None),
}


def write_poison(path) -> None:
    lines = []
    for n in range(1, 19):
        if n in GOOD:
            lines.append(
                json.dumps({"id": GOOD[n], "prompt": f"Name a color number {n}."}).encode()
            )
        else:
            lines.append(BAD[n][0])
    path.write_bytes(b"\n".join(lines) + b"\n")


def write_job(tmp_path, engine: str, **input_extra) -> str:
    job = {
        "name": "poison",
        "model": {"source": "smollm2-135m-instruct", "dtype": "float32", "max_model_len": 64},
        "input": {
            "path": str(tmp_path / "poison.jsonl"),
            "use_chat_template": False,
            **input_extra,
        },
        "generation": {"max_new_tokens": 6},
        "output": {"path": str(tmp_path / "out"), "format": "jsonl", "shard_rows": 4},
        "engine": {"kind": engine, "max_num_seqs": 4, "kv_cache_bytes": 16 << 20, "num_threads": 1},
    }
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    return str(tmp_path / "job.yaml")


def run(*args: str):
    r = CliRunner().invoke(app, ["run", *args])
    return r, json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("engine", ["static", "paged"])
def test_every_bad_row_explained_every_good_row_done(tmp_path, monkeypatch, engine):
    monkeypatch.setenv("JOBRUNNER_NO_PROGRESS", "1")
    write_poison(tmp_path / "poison.jsonl")
    job = write_job(tmp_path, engine)
    out = tmp_path / "out"

    r, summary = run(job)
    assert r.exit_code == 65, r.output  # 12 of 18 rows failed: over the default 5%
    assert "12 of 18 rows failed" in summary["error"]
    results = read_results(out)
    assert sorted(x["id"] for x in results) == sorted(GOOD.values())
    assert all(
        x["finish_reason"] in ("stop", "length") and x["completion_tokens"] > 0 for x in results
    )
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert sorted((e["line"], e["code"], e["id"]) for e in errors) == sorted(
        (n, code, row_id) for n, (_, code, row_id) in BAD.items()
    )
    for e in errors:
        assert e["file"] == str(tmp_path / "poison.jsonl")
        assert f"line {e['line']}" in e["message"]
    # Every row reached a terminal state, but the job failed: its outcome is in the manifest,
    # and _SUCCESS (written only for exit 0) is absent, so no file sensor takes it for done.
    assert not (out / "_SUCCESS").exists()
    assert json.loads((out / "manifest.json").read_text())["outcome"]["exit_code"] == 65
    report = json.loads((out / "report.json").read_text())
    assert (report["rows"]["succeeded"], report["rows"]["failed"]) == (6, 12)

    # Reruns of the finished job answer with its outcome under the rate asked for.
    r, summary = run(job, "--set", "input.max_error_rate=0.7")
    assert (r.exit_code, summary["status"]) == (0, "nothing_to_do"), r.output
    assert (out / "_SUCCESS").exists()
    r, _ = run(job)
    assert r.exit_code == 65, r.output
    assert not (out / "_SUCCESS").exists()


def test_too_long_prompt_is_truncated_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBRUNNER_NO_PROGRESS", "1")
    (tmp_path / "poison.jsonl").write_bytes(
        BAD[5][0] + b"\n" + json.dumps({"id": "g1", "prompt": "Name a color."}).encode() + b"\n"
    )
    r, summary = run(write_job(tmp_path, "static", on_too_long="truncate_left"))
    assert r.exit_code == 0, r.output
    rows = {x["id"]: x for x in read_results(tmp_path / "out")}
    assert rows.keys() == {"e-long", "g1"}
    assert rows["e-long"]["prompt_tokens"] == 63  # max_model_len 64 leaves room for one token
    assert rows["e-long"]["finish_reason"] == "length"
