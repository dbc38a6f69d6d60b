"""Hostile and first-hour probes: the CLI run as a careful user and a hostile one would run it.

Each probe builds its own input and job in a temporary folder, runs `jobrunner` as a subprocess
(the built-in model, 2 new tokens a row) and prints one markdown table row: the probe, what the
issue that listed it saw before, what happens now (exit code, the words that matter, peak RSS
where memory is the point) and whether that is the promised behaviour.

    python scripts/probes.py                 # every probe (a few minutes)
    python scripts/probes.py --only disk     # the probes whose name holds "disk"

Some probes mount a small tmpfs (a full disk, a read-only output): they need root and are
reported as skipped otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    rc: int
    out: str
    err: str
    rss_mb: float
    seconds: float

    @property
    def summary(self) -> dict:
        lines = [x for x in self.out.splitlines() if x.strip().startswith("{")]
        return json.loads(lines[-1]) if lines else {}

    def says(self, *words: str) -> bool:
        text = (self.err + self.out).lower()
        return all(w.lower() in text for w in words)

    def error(self) -> str:
        return " ".join(str(self.summary.get("error", "")).split())[:150]


def jr(args: list[str], cwd: Path, env: dict | None = None, stop_after: float | None = None) -> Run:
    """Run the CLI; its peak RSS comes from wait4 (the child and what it waited for)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobrunner", *args],
            cwd=cwd,
            stdout=out,
            stderr=err,
            env={**os.environ, **(env or {})},
        )
        if stop_after is not None:
            time.sleep(stop_after)
            proc.send_signal(signal.SIGTERM)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        return Run(
            proc.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
            usage.ru_maxrss / 1024,
            seconds,
        )


def write_job(d: Path, input_path: str, out: str = "out", **keys) -> Path:
    """A job on the built-in model, 2 new tokens a row; keys are dotted (`input.id_column`)."""
    job: dict = {
        "model": {"source": "smollm2-135m-instruct", "max_model_len": 512},
        "input": {"path": input_path, "prompt": {"column": "prompt"}},
        "generation": {"max_new_tokens": 2},
        "output": {"path": out},
    }
    for dotted, value in keys.items():
        *parents, last = dotted.split("__")
        node = job
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path = d / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def rows(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"r{i}", "prompt": f"Say hi {i}"} for i in range(start, start + n)]


def write_jsonl(path: Path, records: list[dict] | list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("".join(line + "\n" for line in lines))


def results(run_dir: Path) -> pa.Table:
    parts = sorted((run_dir / "results").glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(p) for p in parts], promote_options="default")


def error_codes(run_dir: Path) -> list[str]:
    path = run_dir / "errors.jsonl"
    if not path.exists():
        return []
    return [json.loads(x).get("code") for x in path.read_text().splitlines() if x.strip()]


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


class Tmpfs:
    """A small tmpfs at `path` (root only): a full disk or a read-only output, for real."""

    def __init__(self, path: Path, size: str, ro: bool = False) -> None:
        self.path, self.size, self.ro = path, size, ro

    def __enter__(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        opts = f"size={self.size}" + (",ro" if self.ro else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(self.path)], check=True)
        return self.path

    def remount(self, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

    def __exit__(self, *exc) -> None:
        subprocess.run(["umount", str(self.path)], check=False)


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


# Each probe: (name, what was seen before, function(dir) -> (now, ok)).
PROBES: list[tuple[str, str, object]] = []


def probe(name: str, before: str):
    def register(fn):
        PROBES.append((name, before, fn))
        return fn

    return register


# 1. The input's identity is its content


@probe("same-size edit of a committed row and an id", "exit 0, 41 results for 40 rows")
def same_size_edit(d: Path):
    data = d / "in.jsonl"
    write_jsonl(data, rows(8))
    job = write_job(d, "in.jsonl")
    first = jr(["run", str(job)], d)
    edited = rows(8)
    edited[3]["prompt"] = "Say ho 3"
    edited[5]["id"] = "q5"
    write_jsonl(data, edited)
    again = jr(["run", str(job)], d)
    n = results(d / "out").num_rows
    ok = first.rc == 0 and again.rc == 78 and again.says("in.jsonl", "r3") and n == 8
    return f"exit {again.rc}: {again.error()}; results still {n}", ok


@probe("the same job from another working directory", "refused as a different job, no file named")
def other_cwd(d: Path):
    write_jsonl(d / "data" / "in.jsonl", rows(4))
    job = write_job(d / "data", "in.jsonl", out="../out")
    first = jr(["run", "data/job.yaml"], d)
    again = jr(["run", "job.yaml"], d / "data")
    ok = first.rc == 0 and again.rc == 0 and results(d / "out").num_rows == 4
    return f"exit {first.rc} then {again.rc} from {job.parent.name}/; 4 rows once", ok


@probe("fix the failed rows, then --retry-errors", "refused: the fix changed the size")
def retry_after_fix(d: Path):
    data = d / "in.jsonl"
    recs = [{"id": f"r{i}", "n": i} for i in range(8)]
    recs[2]["n"] = "two"
    write_jsonl(data, recs)
    job = write_job(
        d, "in.jsonl", input__prompt={"template": "Count to {n:d}"}, input__max_error_rate=0.5
    )
    first = jr(["run", str(job)], d)
    cost_before = json.loads((d / "out" / "report.json").read_text())["cost"]["cost_usd"]
    recs[2]["n"] = 2
    write_jsonl(data, recs)
    again = jr(["run", str(job), "--retry-errors"], d)
    cost_after = json.loads((d / "out" / "report.json").read_text())["cost"]["cost_usd"]
    codes, n = error_codes(d / "out"), results(d / "out").num_rows
    ok = first.rc == 0 and again.rc == 0 and n == 8 and not codes and cost_after >= cost_before
    return (
        f"exit {first.rc} (1 bad_format) then {again.rc}: 8 results, {len(codes)} errors; "
        f"cost {cost_before:.2e} -> {cost_after:.2e} USD (never lowered)",
        ok,
    )


# 2. Any bad row is a row error, never a job crash


def one_bad_row(d: Path, bad_line: str, code: str, **keys):
    write_jsonl(d / "in.jsonl", [*[json.dumps(r) for r in rows(5)], bad_line])
    job = write_job(d, "in.jsonl", input__max_error_rate=0.5, **keys)
    run = jr(["run", str(job)], d)
    codes, n = error_codes(d / "out"), results(d / "out").num_rows if run.rc == 0 else 0
    ok = run.rc == 0 and codes == [code] and n == 5
    return run, f"exit {run.rc}: 5 results, errors {codes}; peak RSS {run.rss_mb:.0f} MB", ok


@probe("a lone UTF-16 surrogate in a JSONL string", "exit 70 on every run")
def surrogate(d: Path):
    _, now, ok = one_bad_row(d, '{"id": "bad", "prompt": "a \\ud800 b"}', "invalid_unicode")
    return now, ok


@probe("a value nested 5,000 deep", "exit 70 on every run")
def deep_nesting(d: Path):
    deep = "[" * 5000 + "]" * 5000
    _, now, ok = one_bad_row(d, f'{{"id": "bad", "prompt": "x", "extra": {deep}}}', "too_complex")
    return now, ok


@probe("a value its template format spec does not fit", "exit 70 on every run")
def format_spec(d: Path):
    recs = [{**r, "n": i} for i, r in enumerate(rows(5))]
    write_jsonl(d / "in.jsonl", [*recs, {"id": "bad", "prompt": "x", "n": "seven"}])
    job = write_job(
        d, "in.jsonl", input__max_error_rate=0.5, input__prompt={"template": "{prompt} {n:d}"}
    )
    run = jr(["run", str(job)], d)
    codes, n = error_codes(d / "out"), results(d / "out").num_rows if run.rc == 0 else 0
    return f"exit {run.rc}: {n} results, errors {codes}", run.rc == 0 and codes == ["bad_format"]


@probe("a 50 MB prompt line", "7.5 GB RSS before being refused")
def huge_line(d: Path):
    """The line may cost a few copies of itself, not the 7.5 GB it did: its peak RSS against the
    same job's with a 1 kB line instead (the model and the KV cache's pages are most of both)."""
    (d / "base").mkdir()
    base, _, _ = one_bad_row(d / "base", json.dumps({"id": "bad", "prompt": "x" * 1000}), "")
    run, now, ok = one_bad_row(d, json.dumps({"id": "bad", "prompt": "x" * 50_000_000}), "too_long")
    more = run.rss_mb - base.rss_mb
    return f"{now} ({more:+.0f} MB against a 1 kB line's run)", ok and more < 500


@probe("a template width spec of 10^9", "1.3 GB for one row")
def width_spec(d: Path):
    write_jsonl(d / "in.jsonl", rows(3))
    job = write_job(d, "in.jsonl", input__prompt={"template": "{prompt:>1000000000}"})
    run = jr(["run", str(job)], d)
    ok = run.rc == 78 and run.rss_mb < 1000
    return f"exit {run.rc}: {run.error()}; peak RSS {run.rss_mb:.0f} MB", ok


@probe("every Arrow type in a Parquet input", "(new) binary, timestamps, decimals, nesting")
def arrow_types(d: Path):
    import datetime
    import decimal

    n = 3
    table = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "prompt": [f"Say hi {i}" for i in range(n)],
            "blob": pa.array([b"\x00\xff", b"", None], pa.binary()),
            "when": pa.array(
                [datetime.datetime(2024, 1, i + 1) for i in range(n)], pa.timestamp("us")
            ),
            "price": pa.array([decimal.Decimal("1.10")] * n, pa.decimal128(10, 2)),
            "tags": pa.array([["a"], [], None], pa.list_(pa.string())),
            "meta": pa.array([{"k": 1}, {"k": None}, None], pa.struct([("k", pa.int32())])),
        }
    )
    pq.write_table(table, d / "in.parquet")
    job = write_job(d, "in.parquet")
    run = jr(["run", str(job)], d)
    got = results(d / "out") if run.rc == 0 else pa.table({})
    kept = {
        f.name: str(f.type) for f in got.schema if f.name in ("blob", "when", "price", "input_id")
    }
    ok = run.rc == 0 and got.num_rows == n and kept.get("blob") == "binary"
    ok = ok and kept.get("when", "").startswith("timestamp") and kept.get("input_id") == "int64"
    return f"exit {run.rc}: {got.num_rows} rows; kept types {kept}", ok


# 3. Finishing is atomic from the outside


@probe("a finished run whose report.json is gone", "every rerun exit 70 (FileNotFoundError)")
def missing_report(d: Path):
    write_jsonl(d / "in.jsonl", rows(3))
    job = write_job(d, "in.jsonl")
    first = jr(["run", str(job)], d)
    (d / "out" / "report.json").unlink()
    (d / "out" / "report.md").unlink()
    again = jr(["run", str(job)], d)
    ok = first.rc == again.rc == 0 and (d / "out" / "report.json").exists()
    loaded = "no model loaded" if not again.says("loading") else "model loaded"
    return f"exit {again.rc}: reports rebuilt ({loaded}, {again.seconds:.1f} s)", ok


@probe("every row fails", "(decide) _SUCCESS written for a failed job")
def all_fail(d: Path):
    write_jsonl(d / "in.jsonl", rows(4))
    job = write_job(d, "in.jsonl", input__max_prompt_chars=1)
    first = jr(["run", str(job)], d)
    again = jr(["run", str(job)], d)
    ok = first.rc == again.rc == 65 and not (d / "out" / "_SUCCESS").exists()
    return f"exit {first.rc}, no _SUCCESS; rerun exit {again.rc} in {again.seconds:.1f} s", ok


@probe("a full disk while the reports are written", "a 3 MB temp file left behind")
def full_disk(d: Path):
    if not can_mount():
        return "skipped: needs root to mount a tmpfs", True
    write_jsonl(d / "in.jsonl", rows(4))
    with Tmpfs(d / "small", "256k") as fs:
        job = write_job(d, "in.jsonl", out=str(fs / "out"))
        full = jr(["run", str(job)], d)
        left = [p.name for p in fs.rglob("*") if ".tmp" in p.name]
        Tmpfs.remount(Tmpfs(fs, ""), "64m")
        again = jr(["run", str(job)], d)
        done = (fs / "out" / "_SUCCESS").exists()
        n = results(fs / "out").num_rows if done else 0
    ok = full.rc == 75 and not left and again.rc == 0 and n == 4 and full.says(str(fs))
    return (
        f"exit {full.rc}: {full.error()}; temp files left {left}; "
        f"after freeing space exit {again.rc}, {n} rows, _SUCCESS {done}"
    ), ok


@probe("SIGTERM during the first GGUF dequantize", "517 MB left in the cache")
def signal_dequantize(d: Path):
    write_jsonl(d / "in.jsonl", rows(2))
    job = write_job(d, "in.jsonl")
    cache = d / "cache"
    run = jr(["run", str(job)], d, env={"JOBRUNNER_CACHE": str(cache)}, stop_after=6.0)
    gguf = cache / "gguf"
    left = sum(p.stat().st_size for p in gguf.rglob("*") if p.is_file()) if gguf.exists() else 0
    ok = run.rc == 75 and left == 0
    return f"exit {run.rc}; {left / 1e6:.0f} MB left in the cache", ok


# 4. The run directory is ours alone


@probe(
    "a folder of the user's files as output.path (also --restart)",
    "errors.jsonl truncated, results/ deleted",
)
def foreign_dir(d: Path):
    write_jsonl(d / "in.jsonl", rows(2))
    out = d / "out"
    (out / "results").mkdir(parents=True)
    (out / "errors.jsonl").write_text("the user's own file\n")
    (out / "results" / "notes.txt").write_text("mine\n")
    before = snapshot(out)
    job = write_job(d, "in.jsonl")
    run = jr(["run", str(job)], d)
    restart = jr(["run", str(job), "--restart"], d)
    ok = run.rc == restart.rc == 78 and snapshot(out) == before
    return (
        f"exit {run.rc}, --restart exit {restart.rc}; every file byte for byte: {snapshot(out) == before}",
        ok,
    )


@probe("shards of another job with no manifest", "their rows mixed with the new job's")
def foreign_shards(d: Path):
    write_jsonl(d / "a.jsonl", rows(3))
    write_jsonl(d / "b.jsonl", rows(3, start=10))
    job = write_job(d, "a.jsonl")
    jr(["run", str(job)], d)
    (d / "out" / "manifest.json").unlink()
    job = write_job(d, "b.jsonl")
    run = jr(["run", str(job)], d)
    return f"exit {run.rc}: {run.error()}", run.rc == 78


@probe("an empty output.path", "wrote into the working directory")
def empty_output(d: Path):
    write_jsonl(d / "in.jsonl", rows(2))
    job = write_job(d, "in.jsonl", out="")
    run = jr(["run", str(job)], d)
    return f"exit {run.rc}: {run.error()}", run.rc == 78 and not (d / "results").exists()


@probe(
    "the output folder inside the input folder",
    "read its own manifest as rows, then refused every run",
)
def output_in_input(d: Path):
    write_jsonl(d / "data" / "in.jsonl", rows(3))
    job = write_job(d, "data", out="data/out")
    first = jr(["run", str(job)], d)
    again = jr(["run", str(job)], d)
    n = results(d / "data" / "out").num_rows if first.rc == 0 else 0
    return f"exit {first.rc} then {again.rc}; {n} rows", first.rc == again.rc == 0 and n == 3


def damaged(d: Path, damage) -> tuple[str, bool]:
    write_jsonl(d / "in.jsonl", rows(3))
    job = write_job(d, "in.jsonl", output__shard_rows=1)
    jr(["run", str(job)], d)
    name = damage(d / "out")
    run = jr(["run", str(job)], d)
    return f"exit {run.rc}: {run.error()}", run.rc == 78 and run.says(name)


@probe("a truncated shard", "a traceback")
def truncated_shard(d: Path):
    def cut(out: Path) -> str:
        shard = sorted((out / "results").glob("part-*"))[0]
        shard.write_bytes(shard.read_bytes()[:40])
        return shard.name

    return damaged(d, cut)


@probe("a manifest that is not JSON", "a traceback")
def bad_manifest(d: Path):
    def spoil(out: Path) -> str:
        (out / "manifest.json").write_text("{not json")
        return "manifest.json"

    return damaged(d, spoil)


@probe("a stray file in results/ (part-00000.parquet.bak)", "a traceback")
def stray_file(d: Path):
    def stray(out: Path) -> str:
        shard = sorted((out / "results").glob("part-*"))[0]
        shutil.copy(shard, out / "results" / (shard.name + ".bak"))
        return shard.name + ".bak"

    return damaged(d, stray)


@probe("a shard moved out of a finished run", "(new) the run said done with rows missing")
def shard_moved_out(d: Path):
    write_jsonl(d / "in.jsonl", rows(3))
    job = write_job(d, "in.jsonl", output__shard_rows=1)
    jr(["run", str(job)], d)
    sorted((d / "out" / "results").glob("part-*"))[0].rename(d / "moved.parquet")
    run = jr(["run", str(job)], d)
    n = results(d / "out").num_rows if run.rc == 0 else 0
    return f"exit {run.rc}: {n} rows, the moved shard's row generated again", run.rc == 0 and n == 3


# 5. The input is read as the user laid it out


@probe("a ** glob over a symlink loop, a file reached twice", "hung for minutes")
def symlink_loop(d: Path):
    write_jsonl(d / "data" / "a" / "in.jsonl", rows(3))
    (d / "data" / "a" / "loop").symlink_to(d / "data")
    (d / "data" / "again").symlink_to(d / "data" / "a")
    job = write_job(d, "data/**/*.jsonl")
    run = jr(["run", str(job)], d)
    n = results(d / "out").num_rows if run.rc == 0 else 0
    return f"exit {run.rc} in {run.seconds:.0f} s; {n} rows (each once)", run.rc == 0 and n == 3


@probe("2024/part.jsonl and 2025/part.jsonl with derived ids", "refused as duplicate ids")
def derived_ids(d: Path):
    for year in ("2024", "2025"):
        write_jsonl(d / "data" / year / "part.jsonl", [{"prompt": f"hi {i}"} for i in range(2)])
    job = write_job(d, "data", input__id_column=None)
    run = jr(["run", str(job)], d)
    ids = sorted(results(d / "out").column("id").to_pylist()) if run.rc == 0 else []
    return f"exit {run.rc}: ids {ids}", run.rc == 0 and len(set(ids)) == 4


@probe("a JSONL column that only later rows have", "dropped from the results")
def late_column(d: Path):
    recs = rows(4)
    recs[3]["late"] = "kept?"
    write_jsonl(d / "in.jsonl", recs)
    job = write_job(d, "in.jsonl")
    run = jr(["run", str(job)], d)
    got = results(d / "out") if run.rc == 0 else pa.table({})
    values = [v for v in got.column("late").to_pylist() if v] if "late" in got.column_names else []
    return f"exit {run.rc}: column late = {values}", run.rc == 0 and values == ["kept?"]


# 6. User errors are never internal errors


@probe("a read-only output directory", "exit 70")
def read_only(d: Path):
    if not can_mount():
        return "skipped: needs root to mount a tmpfs", True
    write_jsonl(d / "in.jsonl", rows(2))
    with Tmpfs(d / "ro", "1m", ro=True) as fs:
        job = write_job(d, "in.jsonl", out=str(fs / "out"))
        run = jr(["run", str(job)], d)
    return f"exit {run.rc}: {run.error()}", run.rc == 78 and run.says(str(fs))


@probe("output.path is a file", "exit 70")
def output_is_file(d: Path):
    write_jsonl(d / "in.jsonl", rows(2))
    (d / "out").write_text("a file\n")
    job = write_job(d, "in.jsonl")
    run = jr(["run", str(job)], d)
    return f"exit {run.rc}: {run.error()}", run.rc == 78


@probe("an unwritable cache (read-only JOBRUNNER_CACHE)", "exit 70 after the dequantize")
def unwritable_cache(d: Path):
    if not can_mount():
        return "skipped: needs root to mount a tmpfs", True
    write_jsonl(d / "in.jsonl", rows(2))
    job = write_job(d, "in.jsonl")
    with Tmpfs(d / "cache", "1m", ro=True) as fs:
        run = jr(["run", str(job)], d, env={"JOBRUNNER_CACHE": str(fs)})
    ok = run.rc == 0 and run.says("not writable")
    return f"exit {run.rc}: warned and fell back to the temp cache: {run.says('not writable')}", ok


@probe("a template field with attribute access ({prompt.upper})", "exit 70")
def refused_field(d: Path):
    write_jsonl(d / "in.jsonl", rows(2))
    job = write_job(d, "in.jsonl", input__prompt={"template": "{prompt.__class__}"})
    run = jr(["run", str(job)], d)
    return f"exit {run.rc}: {run.error()}", run.rc == 78


@probe("pickled weights (pytorch_model.bin)", "exit 70")
def pickle_weights(d: Path):
    model = d / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    write_jsonl(d / "in.jsonl", rows(2))
    job = write_job(d, "in.jsonl", model__source=str(model))
    run = jr(["run", str(job)], d)
    return f"exit {run.rc}: {run.error()}", run.rc == 78 and run.says("pickle")


@probe("jobrunner report on a folder that is no run", "exit 70")
def report_no_run(d: Path):
    (d / "stuff").mkdir()
    run = jr(["report", str(d / "stuff")], d)
    return f"exit {run.rc}: {run.error()}", run.rc == 78


# The first hour (the first-hour issue's mistakes)


def columns_job(d: Path, **keys) -> Path:
    pq.write_table(
        pa.table({"id": ["a", "b"], "title": ["T1", "T2"], "body": ["B1", "B2"]}), d / "in.parquet"
    )
    return write_job(d, "in.parquet", **keys)


@probe(
    "a template field that is no column ({titel})", "one error per row; run loaded the model first"
)
def typo_field(d: Path):
    job = columns_job(d, input__prompt={"template": "{titel}: {body}"})
    val, run = jr(["validate", str(job)], d), jr(["run", str(job)], d)
    ok = val.rc == run.rc == 78 and run.says("did you mean title") and not run.says("loading")
    return f"validate {val.rc}, run {run.rc} in {run.seconds:.1f} s: {run.error()}", ok


@probe("a misspelled id_column", "fell back to derived ids without a word")
def typo_id(d: Path):
    job = columns_job(d, input__prompt={"template": "{title}"}, input__id_column="idd")
    run = jr(["run", str(job)], d)
    return f"exit {run.rc}: {run.error()}", run.rc == 78 and run.says("did you mean id")


@probe("an unknown key (generation.max_tokens)", "no 'did you mean'")
def typo_key(d: Path):
    job = columns_job(d, input__prompt={"template": "{title}"}, generation__max_tokens=5)
    run = jr(["validate", str(job)], d)
    return f"exit {run.rc}: {run.error()}", run.rc == 78 and run.says("max_new_tokens")


@probe(
    "the quickstart from another folder", "no input files found at 'data/samples/prompts.parquet'"
)
def quickstart_elsewhere(d: Path):
    run = jr(["validate", str(REPO / "jobs" / "quickstart.yaml")], d)
    return f"exit {run.rc} from {d}: input resolved against the job file's folder", run.rc == 0


@probe("jobrunner --version; --help of every command", "no --version; '--help <bool>', '{job}'")
def version_help(d: Path):
    version = jr(["--version"], d)
    odd = []
    for cmd in ("run", "estimate", "validate", "report", "quantize-check", "init"):
        text = jr([cmd, "--help"], d).out
        odd += [f"{cmd}: {tag}" for tag in ("<bool>", "{job}", "<text>") if tag in text]
    ok = version.rc == 0 and version.out.strip() and not odd
    return f"--version: {version.out.strip()!r}; odd tags in --help: {odd or 'none'}", bool(ok)


@probe("jobrunner init on a CSV, then run it as is", "(new)")
def init_csv(d: Path):
    (d / "reviews.csv").write_text(
        "review_id,product,review\n1,lamp,Bright and cheap.\n2,kettle,Leaks at the base.\n"
    )
    init = jr(["init", "reviews.csv"], d)
    job = d / "reviews.yaml"
    run = jr(["run", str(job), "--set", "generation.max_new_tokens=2"], d) if job.exists() else init
    ok = init.rc == 0 and run.rc == 0
    return f"init exit {init.rc} wrote {job.name}; run exit {run.rc}", ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", default="", help="run the probes whose function name holds this")
    args = ap.parse_args()
    chosen = [p for p in PROBES if args.only in p[2].__name__]
    print("| probe | before | now | as promised |\n| --- | --- | --- | --- |")
    failed = 0
    for name, before, fn in chosen:
        with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
            try:
                now, ok = fn(Path(tmp))
            except Exception as e:  # a probe that breaks is reported, not hidden
                now, ok = f"probe broke: {type(e).__name__}: {e}", False
        failed += not ok
        print(
            f"| {name} | {before} | {now.replace('|', '/')} | {'yes' if ok else 'NO'} |", flush=True
        )
    print(f"\n{len(chosen) - failed} of {len(chosen)} as promised")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
