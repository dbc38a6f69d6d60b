"""The Ray executor: same results as a local run, every row exactly once through worker and
driver deaths. One local Ray cluster (CPU workers) is shared by the module; the real model."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobrunner.config import JobConfig
from jobrunner.errors import InputDataError, JobError, RunDirError
from jobrunner.executors.ray_blocks import (
    claim_run,
    fragment_files,
    merge_errors,
    next_run_tag,
    plan_blocks,
    write_fragment,
)
from jobrunner.io.rundir import RunDir
from jobrunner.pipeline import RunOptions
from jobrunner.telemetry.progress import Progress
from jobrunner.telemetry.timeline import DEVICE_FILE, STEPS_FILE, read_timeline
from jobrunner.types import RowError, RowRef

ROOT = Path(__file__).resolve().parents[1]
TOPICS = [
    "lists",
    "dicts",
    "sets",
    "tuples",
    "generators",
    "decorators",
    "classes",
    "modules",
    "exceptions",
    "files",
    "strings",
    "loops",
    "functions",
    "lambdas",
    "imports",
    "typing",
]


@pytest.fixture(scope="module")
def input_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("input") / "questions.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(TOPICS):
            f.write(
                json.dumps({"id": f"q{i:02d}", "prompt": f"In one sentence, what are Python {t}?"})
                + "\n"
            )
        f.write(json.dumps({"id": "q16", "prompt": "word " * 3000}) + "\n")  # too long: fails
    return path


def job(input_file: Path, out: Path, executor: str = "ray", **ray) -> dict:
    return {
        "model": {"dtype": "float32"},
        "input": {"path": str(input_file), "max_error_rate": 0.5},
        "generation": {"max_new_tokens": 8},
        "engine": {"kind": "static"},
        "output": {"path": str(out), "format": "jsonl"},
        "executor": executor,
        "ray": {"num_workers": 2, "block_rows": 4, **ray},
    }


def run(data: dict, **opts):
    from jobrunner.executors import run_with_executor

    return run_with_executor(JobConfig.model_validate(data), RunOptions(**opts))


def results(out: Path) -> dict[str, tuple]:
    """id -> what the model produced; fails if any id is in the results twice."""
    seen: dict[str, tuple] = {}
    for shard in sorted((out / "results").glob("part-*")):
        for line in shard.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            assert r["id"] not in seen, f"{r['id']} twice (again in {shard.name})"
            seen[r["id"]] = (
                r["completion"],
                r["finish_reason"],
                r["prompt_tokens"],
                r["completion_tokens"],
            )
    return seen


def errors(out: Path) -> list[tuple]:
    lines = (out / "errors.jsonl").read_text(encoding="utf-8").splitlines()
    return [(e["id"], e["code"]) for e in map(json.loads, lines)]


# ------------------------------------------------------------ plumbing (no ray, no model)


def test_blocks_hold_only_pending_rows_and_bad_ids_become_errors(tmp_path):
    src = tmp_path / "in.jsonl"
    rows = [{"id": f"r{i}", "prompt": "hi"} for i in range(7)] + [{"id": None, "prompt": "x"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    cfg = JobConfig.model_validate({"input": {"path": str(src)}})
    plan = plan_blocks(cfg, skip_ids={"r1", "r5"}, block_rows=2)
    from jobrunner.executors.ray_blocks import unpack_block

    ids = [[r.values["id"] for r in unpack_block(b["payload"])[0]] for b in plan.blocks]
    assert ids == [["r0", "r2"], ["r3", "r4"], ["r6"]]
    assert [b["block"] for b in plan.blocks] == [0, 1, 2]
    assert (plan.skipped, plan.rows) == (2, 5)
    assert sorted(e.code for e in plan.errors) == ["malformed_json", "missing_id"]


def parquet_input(path: Path, ids: list, prompts: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ids, "prompt": prompts}), path, row_group_size=3)
    return path


def no_rows_read_here(monkeypatch) -> None:
    """In this process (the driver), reading a Parquet row or any row of the input fails."""
    import jobrunner.executors.ray_blocks as ray_blocks
    import jobrunner.formats.parquet as parquet

    def refused(*args, **kwargs):
        raise AssertionError("the driver read input rows")

    monkeypatch.setattr(parquet, "_batch_rows", refused)
    monkeypatch.setattr(ray_blocks, "_row_blocks", refused)
    monkeypatch.setattr(ray_blocks, "_line_blocks", refused)


def test_parquet_blocks_are_file_and_row_ranges_read_by_the_worker(tmp_path, monkeypatch):
    from jobrunner.executors.ray_blocks import unpack_block
    from jobrunner.io.ids import IdSet

    ids = [f"r{i}" for i in range(7)] + [None]
    src = parquet_input(tmp_path / "in.parquet", ids, ["SECRET PROMPT"] * 8)
    cfg = JobConfig.model_validate({"input": {"path": str(src)}})
    with monkeypatch.context() as m:
        no_rows_read_here(m)
        plan = plan_blocks(cfg, skip_ids=IdSet.of(["r1", "r5"]), block_rows=2)
    assert all(b"SECRET" not in b["payload"] for b in plan.blocks)  # descriptions, not rows
    assert (plan.skipped, plan.rows, plan.errors) == (2, 6, [])
    read = [list(unpack_block(b["payload"])[0]) for b in plan.blocks]  # what a worker reads
    assert [[r.values["id"] for r in rows] for rows in read] == [
        ["r0", "r2"],
        ["r3", "r4"],
        ["r6", None],  # the worker's Prep makes the bad id its row error
    ]
    assert [r.source.row for rows in read for r in rows] == [0, 2, 3, 4, 6, 7]
    assert all(r.values["prompt"] == "SECRET PROMPT" for rows in read for r in rows)


@pytest.mark.parametrize("fmt", ["jsonl", "openai-batch"])
def test_line_blocks_are_spans_of_the_input_read_by_the_worker(tmp_path, fmt):
    """A JSONL (or batch) block names a span of lines, not its rows: the driver's memory and
    the object store hold no prompt, and what a worker reads is exactly what the whole file's
    reader gives for those rows (values, row and line numbers; BOM, blank lines, CRLF)."""
    from jobrunner.executors.ray_blocks import unpack_block
    from jobrunner.formats import read_rows

    def line(i):
        if fmt == "jsonl":
            return {"id": f"r{i}", "prompt": f"SECRET PROMPT {i}"}
        body = {"messages": [{"role": "user", "content": f"SECRET PROMPT {i}"}]}
        return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}

    lines = [json.dumps(line(i)) for i in range(9)]
    lines[4:4] = ["", "not json"]  # a blank line, then an unreadable one
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n\n")
    cfg = JobConfig.model_validate({"input": {"path": str(src), "format": fmt}})
    plan = plan_blocks(cfg, skip_ids={"r1", "r5", "r6"}, block_rows=2)
    assert all(b"SECRET" not in b["payload"] for b in plan.blocks)
    assert (plan.skipped, plan.rows) == (3, 6)
    assert [e.code for e in plan.errors] == ["malformed_json"]
    read = [list(unpack_block(b["payload"])[0]) for b in plan.blocks]
    assert [len(rows) for rows in read] == [2, 2, 2]
    whole = {r.source.row: r for r in read_rows(str(src), fmt) if not isinstance(r, RowError)}
    got = [r for rows in read for r in rows]
    assert [(r.source, r.values) for r in got] == [
        (whole[r.source.row].source, whole[r.source.row].values) for r in got
    ]
    assert [r.source.line for r in got] == [1, 3, 4, 7, 10, 11]  # r0 r2 r3 r4 r7 r8


def test_a_compressed_file_is_cut_in_spans_each_read_past_the_text_before_it(tmp_path):
    """A compressed file's blocks are spans of its text, as a plain file's: a worker reads the
    stream past the text before its span (no seek), so a big .jsonl.gz spreads over workers and
    commits block by block. What the workers read is what the whole file's reader gives."""
    import gzip

    from jobrunner.executors.ray_blocks import unpack_block
    from jobrunner.formats import read_rows
    from jobrunner.formats.lines import iter_lines

    data = tmp_path / "data"
    data.mkdir()
    text = "".join(json.dumps({"id": f"r{i}", "prompt": f"p{i}"}) + "\n" for i in range(9))
    (data / "a.jsonl.gz").write_bytes(gzip.compress(("\n" + text + "not json\n").encode()))
    (data / "b.jsonl").write_text(text.replace('"r', '"b'))
    cfg = JobConfig.model_validate({"input": {"path": str(data)}})
    plan = plan_blocks(cfg, skip_ids={"r1", "r5", "b0"}, block_rows=2)
    spans = [pickle.loads(b["payload"])["lines"] for b in plan.blocks]
    packed = str(data / "a.jsonl.gz")
    mine = [k for k, s in enumerate(spans) if s["file"] == packed]
    assert len(mine) == 4 and len(spans) == 4 + 4  # a's 7 pending rows and b's 8, 2 a block
    assert spans[mine[0]]["start"] == (1, 2, 0) and spans[mine[-1]]["start"][0] > 0
    assert (plan.skipped, plan.rows, [e.code for e in plan.errors]) == (3, 15, ["malformed_json"])
    got = [r for k in mine for r in unpack_block(plan.blocks[k]["payload"])[0]]
    whole = [r for r in read_rows(packed) if not isinstance(r, RowError)]
    assert [(r.source, r.values) for r in got] == [
        (r.source, r.values) for r in whole if r.values["id"] not in ("r1", "r5")
    ]
    assert [r.source.line for r in got][:2] == [2, 4]  # the blank first line counts
    with pytest.raises(InputDataError, match="changed while the run read it"):
        next(iter_lines(packed, (10_000, 99, 98)))  # past the text's end: the file changed


def test_merging_error_fragments_twice_adds_nothing(tmp_path):
    rundir = RunDir(tmp_path, "jsonl")
    m = rundir.prepare()
    e1 = RowError("too_long", "in.jsonl:line 3: too long", RowRef("in.jsonl", 2, 3), "r2", "prompt")
    e2 = RowError("malformed_json", "in.jsonl:line 9: bad", RowRef("in.jsonl", 8, 9))
    write_fragment(tmp_path / "ray-errors" / "r0001-b00000.jsonl", [e1])
    assert merge_errors(rundir, m, [e2], fragment_files(rundir)) == 2
    write_fragment(tmp_path / "ray-errors" / "r0001-b00000.jsonl", [e1])  # a retried block
    assert merge_errors(rundir, m, [e2], fragment_files(rundir)) == 0
    assert [e["id"] for e in rundir.iter_errors()] == [None, "r2"]  # driver errors first
    assert fragment_files(rundir) == []
    assert m.errors_bytes == rundir.errors_path.stat().st_size


def test_run_tags_never_repeat_even_when_a_run_committed_nothing(tmp_path):
    rundir = RunDir(tmp_path, "parquet")
    rundir.prepare()
    assert next_run_tag(rundir) == "r0001"
    claim_run(rundir, "r0001")  # that driver died before any block landed
    assert next_run_tag(rundir) == "r0002"
    (rundir.results / "part-r0007-b00003.parquet").write_bytes(b"")
    (rundir.results / "part-00004.parquet").write_bytes(b"")
    assert next_run_tag(rundir) == "r0008"
    assert rundir.next_shard_name() == "part-00005.parquet"  # local numbering ignores ray names


def test_one_worker_per_gpu_else_one_per_cpus_per_worker():
    pytest.importorskip("ray")
    from jobrunner.executors.ray import _worker_cfg, pool_size

    gpu_job = JobConfig.model_validate({"model": {"device": "cuda:1"}})
    assert pool_size(gpu_job, {"CPU": 32, "GPU": 8}) == (8, 1.0, 1.0)
    assert _worker_cfg(gpu_job).model.device == "cuda"  # Ray gives each worker its own GPU
    cpu_job = JobConfig.model_validate({"model": {"device": "cpu"}, "ray": {"cpus_per_worker": 4}})
    assert pool_size(cpu_job, {"CPU": 17, "GPU": 2}) == (4, 4.0, 0.0)  # one CPU left spare
    sized = JobConfig.model_validate({"ray": {"num_workers": 3}})
    assert pool_size(sized, {"CPU": 2}) == (3, 1.0, 0.0)


def test_a_block_is_prepared_as_the_local_run_prepares_its_input(tmp_path):
    """A worker's Prep over one block: committed rows skipped, a duplicate run once, shared
    heads next to each other (prefix ordering), as the local run's stream does."""
    from jobrunner.engine.loader import load_tokenizer
    from jobrunner.executors.ray_blocks import unpack_block
    from jobrunner.prep.stream import Prep

    heads = {"a": "Answer in French, politely and briefly: ", "b": "Reply as a pirate would: "}
    src = tmp_path / "in.jsonl"
    rows = [(f"{h}{i}", f"{heads[h]}question {i}") for i in range(3) for h in "ab"]
    rows.append(("dup", rows[0][1]))
    src.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in rows))
    cfg = JobConfig.model_validate({"input": {"path": str(src)}})
    (block,) = plan_blocks(cfg, skip_ids=set(), block_rows=16).blocks
    prep = Prep(cfg, load_tokenizer(cfg.model), skip_ids={"b1"})
    ids = [r.id for r in prep.requests(unpack_block(block["payload"])[0])]
    assert sorted(ids) == ["a0", "a1", "a2", "b0", "b2"]  # b1 committed, dup rides along a0
    assert prep.skipped == 1 and prep.deduplicated == 1
    firsts = [k for k, i in enumerate(ids) if k == 0 or i[0] != ids[k - 1][0]]
    assert len(firsts) == 2  # the a rows together, the b rows together


# ------------------------------------------------------------ a real cluster, the real model


def test_landed_blocks_merge_into_one_run_record_with_each_workers_timelines():
    from jobrunner.executors.ray import Landed
    from jobrunner.executors.ray_blocks import Plan

    def meta(worker, block, rows, steps):
        rec = {"job": "j", "engine": "static", "steps": steps, "device_count": 1, "notes": []}
        step = {"t": 1.0, "num_running": 1, "worker": worker}
        sample = {"t": 1.0, "device": f"{worker} host", "util_percent": 50.0}
        return {
            "block": block,
            "rows": rows,
            "prompt_tokens": 10 * rows,
            "cost_usd": 0.5,
            "worker": worker,
            "record": rec,
            "steps": [step],
            "samples": [sample],
        }

    landed = Landed()
    for m in (meta("w1", 0, 4, 3), meta("w2", 1, 4, 2), meta("w1", 2, 1, 5)):
        landed.add(m)
    rec = landed.record(JobConfig(), Plan(skipped=2), wall=9.0)
    assert (rec.executor, rec.wall_seconds, rec.skipped, landed.rows) == ("ray", 9.0, 2, 9)
    assert rec.steps == 5 + 2  # each worker's latest counters, summed
    assert [(w["worker"], w["rows"], w["blocks"]) for w in rec.workers] == [
        ("w1", 5, 2),
        ("w2", 4, 1),
    ]
    assert {s["worker"] for s in landed.steps} == {"w1", "w2"}
    progress = Progress(12, live=landed, prompt=landed, log_every=1e9)
    progress.add(landed.rows, 0)
    shown = progress.snapshot()
    progress.close()
    assert (shown.prompt_done, shown.prompt_total, shown.rows_done) == (90, 120, 9)


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    import logging

    ray.init(
        num_cpus=3, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def local_run(input_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local") / "run"
    assert run(job(input_file, out, executor="local")).status == "done"
    return out


@pytest.fixture(scope="module")
def local_results(local_run) -> dict[str, tuple]:
    return results(local_run)


def sections(out: Path) -> tuple[list[str], list[str]]:
    """report.json's key paths (nested objects included) and report.md's headings."""
    report = json.loads((out / "report.json").read_text())
    md = (out / "report.md").read_text().splitlines()
    return key_paths(report), [line for line in md if line.startswith("#")]


def key_paths(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out.append(prefix + k)
        if isinstance(v, dict):
            out += key_paths(v, f"{prefix}{k}.")
    return sorted(out)


@pytest.mark.slow
def test_ray_run_equals_local_run_and_reports_each_worker(
    cluster, input_file, local_run, local_results, tmp_path
):
    out = tmp_path / "run"
    summary = run(job(input_file, out))
    assert summary.status == "done"
    assert summary.rows == {"succeeded": 16, "failed": 1, "skipped": 0}
    assert results(out) == local_results
    assert errors(out) == [("q16", "too_long")]
    assert len(local_results) == 16
    m = json.loads((out / "manifest.json").read_text())
    assert sorted(s["name"] for s in m["shards"]) == [
        f"part-r0001-b{k:05d}.jsonl" for k in range(4)
    ]
    (rec,) = m["runs"]
    assert rec["executor"] == "ray" and sum(w["rows"] for w in rec["workers"]) == 16
    assert sum(w["blocks"] for w in rec["workers"]) == 5  # the 5th holds only q16: no shard
    assert rec["device_count"] == sum(w["device_count"] for w in rec["workers"])
    report = json.loads((out / "report.json").read_text())
    assert report["cost"]["cost_usd"] == pytest.approx(sum(w["cost_usd"] for w in rec["workers"]))
    assert report["workers"] == rec["workers"]
    ray_keys, local_keys = sections(out)[0], sections(local_run)[0]
    assert ray_keys == local_keys, set(ray_keys) ^ set(local_keys)  # the same report
    assert sections(out)[1][1:] == sections(local_run)[1][1:]  # (the title names the job)
    workers = {w["worker"] for w in rec["workers"]}
    steps = read_timeline(out, STEPS_FILE)
    assert steps and {s["worker"] for s in steps} == workers  # each worker's step timeline
    devices = {s["device"].split(" ")[0] for s in read_timeline(out, DEVICE_FILE)}
    assert devices == workers  # and its device samples
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert run(job(input_file, out)).status == "nothing_to_do"  # promise 8, no cluster needed
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    for s in m["shards"]:  # recorded as the local commit records them
        assert s["bytes"] == (out / "results" / s["name"]).stat().st_size
    with open(out / "results" / m["shards"][0]["name"], "ab") as f:
        f.write(b"\n")  # a shard changed after its commit: the rerun names it
    with pytest.raises(RunDirError, match="changed after it was committed"):
        run(job(input_file, out))


@pytest.mark.slow
def test_the_driver_collects_garbage_while_the_job_runs(
    cluster, input_file, local_results, tmp_path, monkeypatch
):
    """The CLI pauses Python's collector for the start-up (collector.py); a Ray driver, whose
    loop lasts the whole job, turns it on again once connected."""
    import gc

    from jobrunner import collector
    from jobrunner.executors import ray as ray_executor

    seen, execute = [], ray_executor._execute

    def recording(*a, **kw):
        seen.append(gc.isenabled())
        return execute(*a, **kw)

    monkeypatch.setattr(ray_executor, "_execute", recording)
    collector.pause()  # as jobrunner.cli.main does
    try:
        out = tmp_path / "run"
        assert run(job(input_file, out)).status == "done"
    finally:
        collector.resume()
    assert seen == [True]
    assert results(out) == local_results


def test_a_parquet_run_is_read_by_the_workers_and_equals_the_local_run(
    cluster, input_file, local_results, tmp_path, monkeypatch
):
    recs = [json.loads(line) for line in input_file.read_text(encoding="utf-8").splitlines()]
    src = parquet_input(
        tmp_path / "in.parquet", [r["id"] for r in recs], [r["prompt"] for r in recs]
    )
    no_rows_read_here(monkeypatch)  # the workers (other processes) read their blocks
    out = tmp_path / "run"
    summary = run(job(src, out))
    assert summary.rows == {"succeeded": 16, "failed": 1, "skipped": 0}
    assert results(out) == local_results
    assert errors(out) == [("q16", "too_long")]


@pytest.mark.slow
def test_a_worker_runs_the_quality_gate_and_the_driver_exits_with_its_answer(
    cluster, input_file, tmp_path
):
    out = tmp_path / "run"
    data = job(input_file, out)
    data["model"].update(quantization="int4", quality_check=3, quality_min_agreement=1.0)
    with pytest.raises(JobError) as failed:
        run(data)
    assert failed.value.exit_code == 65, failed.value
    assert "model.quality_min_agreement" in str(failed.value)
    assert not (out / "_SUCCESS").exists()
    assert not list((out / "results").glob("part-*"))


@pytest.mark.slow
def test_worker_killed_after_a_commit_still_gives_every_row_once(
    cluster, input_file, local_results, tmp_path, monkeypatch
):
    marker = tmp_path / "worker-died"
    monkeypatch.setenv("JOBRUNNER_RAY_FAULT_MARKER", str(marker))
    out = tmp_path / "run"
    assert run(job(input_file, out)).status == "done"
    assert marker.exists()  # one worker did os._exit(1) right after committing its first shard
    assert results(out) == local_results  # no row lost, none twice, same text
    assert errors(out) == [("q16", "too_long")]
    workers = json.loads((out / "manifest.json").read_text())["runs"][0]["workers"]
    assert sum(w["rows"] for w in workers) == 16


@pytest.mark.slow
def test_resume_after_the_driver_is_killed(cluster, input_file, local_results, tmp_path):
    import yaml

    out = tmp_path / "run"
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job(input_file, out, num_workers=1, block_rows=2)))
    env = {**os.environ, "RAY_ADDRESS": cluster, "JOBRUNNER_NO_PROGRESS": "1"}
    cli = "from jobrunner.cli import main; main()"
    driver = subprocess.Popen(
        [sys.executable, "-c", cli, "run", str(job_file)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    while not list((out / "results").glob("part-*")) and driver.poll() is None:
        assert time.monotonic() < deadline, "no shard committed in time"
        time.sleep(0.1)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert driver.returncode == -signal.SIGKILL, driver.stderr.read().decode()[-2000:]
    assert not (out / "_SUCCESS").exists()
    committed = len(results(out))
    assert 0 < committed < 16

    summary = run(job(input_file, out, num_workers=1, block_rows=2))
    assert summary.status == "done"
    assert results(out) == local_results
    assert errors(out) == [("q16", "too_long")]
    runs = json.loads((out / "manifest.json").read_text())["runs"]
    assert runs[-1]["skipped"] >= committed  # the dead driver's blocks were not redone
