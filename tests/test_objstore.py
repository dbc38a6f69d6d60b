"""Corpora and run directories in an object store, against a real S3 API server (moto)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobrunner.io import fs as store


def put_parquet(url: str, rows: list[dict]) -> None:
    f, p = store.filesystem(url)
    with f.open(p, "wb") as out:
        pq.write_table(pa.Table.from_pylist(rows), out)


def test_glob_and_read_from_s3(s3_env):
    put_parquet(f"{s3_env}/in/a.parquet", [{"id": "a", "prompt": "x"}])
    put_parquet(f"{s3_env}/in/b.parquet", [{"id": "b", "prompt": "y"}])
    assert store.glob_files(f"{s3_env}/in/*.parquet") == [
        f"{s3_env}/in/a.parquet",
        f"{s3_env}/in/b.parquet",
    ]
    assert store.glob_files(f"{s3_env}/in") == store.glob_files(f"{s3_env}/in/*.parquet")
    with store.open_file(f"{s3_env}/in/b.parquet") as f:
        assert pq.read_table(f).to_pylist() == [{"id": "b", "prompt": "y"}]


def test_a_spark_prefix_is_read_as_spark_reads_it(s3_env):
    """A failed task attempt's copy under _temporary/ and the _SUCCESS marker are not data."""
    from jobrunner.formats import input_files

    rows = [{"id": "a", "prompt": "x"}]
    put_parquet(f"{s3_env}/spark/part-00000.snappy.parquet", rows)
    put_parquet(f"{s3_env}/spark/_temporary/0/_temporary/attempt_1/part-00000.snappy.parquet", rows)
    f, p = store.filesystem(f"{s3_env}/spark/_SUCCESS")
    f.pipe_file(p, b"")
    want = [f"{s3_env}/spark/part-00000.snappy.parquet"]
    assert input_files(f"{s3_env}/spark") == want
    assert input_files(f"{s3_env}/spark/**/*.parquet") == want
    # Hadoop's name for the same store: its listing names the objects s3://
    s3a = s3_env.replace("s3://", "s3a://", 1)
    assert [u.split("://", 1)[1] for u in input_files(f"{s3a}/spark")] == [
        u.split("://", 1)[1] for u in want
    ]


def test_scan_and_read_rows_from_s3(s3_env):
    from jobrunner.config import JobConfig
    from jobrunner.formats import read_rows
    from jobrunner.resume import scan_ids

    put_parquet(f"{s3_env}/in/a.parquet", [{"id": f"a{i}", "prompt": "x"} for i in range(3)])
    f, p = store.filesystem(f"{s3_env}/in/b.jsonl")
    f.pipe_file(p, b'{"id": "b0", "prompt": "y"}\n{"id": "a1", "prompt": "z"}\n')
    cfg = JobConfig.model_validate({"input": {"path": f"{s3_env}/in/a.parquet"}})
    assert scan_ids(cfg) == (3, {})
    assert [r.values["id"] for r in read_rows(f"{s3_env}/in/b.jsonl")] == ["b0", "a1"]


def test_a_ray_block_reads_its_span_of_a_jsonl_object(s3_env):
    """A worker seeks to its block's first line in the object itself (a ranged read)."""
    from jobrunner.config import JobConfig
    from jobrunner.executors.ray_blocks import plan_blocks, unpack_block
    from jobrunner.formats import read_rows

    url = f"{s3_env}/in/c.jsonl"
    f, p = store.filesystem(url)
    f.pipe_file(p, b"".join(b'{"id": "c%d", "prompt": "p%d"}\n' % (i, i) for i in range(7)))
    cfg = JobConfig.model_validate({"input": {"path": url}})
    plan = plan_blocks(cfg, skip_ids={"c2"}, block_rows=2)
    got = [r for b in plan.blocks for r in unpack_block(b["payload"])[0]]
    whole = [r for r in read_rows(url) if r.values["id"] != "c2"]
    assert [(r.source, r.values) for r in got] == [(r.source, r.values) for r in whole]
    assert len(plan.blocks) == 3


def test_a_compressed_object_is_listed_scanned_and_read_as_the_plain_one(s3_env):
    """A prefix's `.jsonl.gz` and `.csv.zst` objects are input files, read as the text they
    hold (ids, lines), by the scan, the rows and a Ray block; one cut short is refused."""
    import gzip

    from jobrunner.config import JobConfig
    from jobrunner.errors import InputDataError
    from jobrunner.executors.ray_blocks import plan_blocks, unpack_block
    from jobrunner.formats import input_files, read_rows
    from jobrunner.resume import scan_ids

    text = b"".join(b'{"id": "g%d", "prompt": "p%d"}\n' % (i, i) for i in range(5))
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(b'id,prompt\nz0,"two\nlines"\nz1,x\n')
    f, p = store.filesystem(f"{s3_env}/in")
    f.pipe_file(f"{p}/a.jsonl.gz", gzip.compress(text))
    f.pipe_file(f"{p}/b.CSV.ZST", sink.getvalue().to_pybytes())
    f.pipe_file(f"{p}/notes.txt.gz", gzip.compress(b"not an input"))
    url = f"{s3_env}/in"
    assert input_files(url) == [f"{url}/a.jsonl.gz", f"{url}/b.CSV.ZST"]
    got = [(r.values["id"], r.source.line) for r in read_rows(url)]
    assert got == [*((f"g{i}", i + 1) for i in range(5)), ("z0", 2), ("z1", 4)]
    assert scan_ids(JobConfig.model_validate({"input": {"path": url}})) == (7, {})
    cfg = JobConfig.model_validate({"input": {"path": f"{url}/a.jsonl.gz"}})
    blocks = plan_blocks(cfg, skip_ids={"g2"}, block_rows=2).blocks  # the second past g0-g2
    read = [r.values["id"] for b in blocks for r in unpack_block(b["payload"])[0]]
    assert len(blocks) == 2 and read == ["g0", "g1", "g3", "g4"]
    f.pipe_file(f"{p}/a.jsonl.gz", gzip.compress(text)[:-12])
    with pytest.raises(InputDataError, match=f"{url}/a.jsonl.gz: the gzip data is cut short"):
        scan_ids(cfg)


# ------------------------------------------------------------------ the commit protocol


def _rec(i: int, reason: str = "stop") -> dict:
    return {"id": f"r{i}", "completion": "c", "finish_reason": reason, "prompt_tokens": 1}


def _err(i: int):
    from jobrunner.types import RowError, RowRef

    return RowError("nan_logits", "the logits were NaN", RowRef("in.jsonl", i), f"r{i}")


def test_store_commits_are_records_and_resume_reads_them(s3_env):
    from jobrunner.io.store_rundir import StoreRunDir

    url = f"{s3_env}/run"
    rd = StoreRunDir(url, "parquet")
    m = rd.prepare()
    rd.save_manifest(m)
    rd.commit(m, [_rec(0), _rec(1, "error")], [_err(1)])
    rd.commit(m, [_rec(2)], [])
    assert m.counts == {"succeeded": 2, "failed": 1}
    again = StoreRunDir(url, "parquet")
    m2 = again.prepare()
    assert m2.counts == {"succeeded": 2, "failed": 1} and len(m2.shards) == 2
    assert again.committed_ids() == {"r0", "r1", "r2"}
    done = again.committed_idset()
    assert len(done) == 3 and "r2" in done and "r3" not in done
    assert [e["id"] for e in again.iter_errors()] == ["r1"]
    again.save_manifest(m2)
    again.mark_success(m2)
    fs, root = store.filesystem(url)
    assert fs.exists(f"{root}/_SUCCESS") and fs.exists(f"{root}/errors.jsonl")
    assert StoreRunDir(url).finished


def test_a_second_run_on_the_prefix_cannot_commit(s3_env):
    import pytest

    from jobrunner.errors import RunLocked
    from jobrunner.io.store_rundir import StoreRunDir

    url = f"{s3_env}/run"
    a, b = StoreRunDir(url), StoreRunDir(url)
    ma, mb = a.prepare(), b.prepare()
    a.save_manifest(ma)  # a claims the next record; b read the prefix before that
    with pytest.raises(RunLocked, match="another jobrunner"):
        b.save_manifest(mb)
    a.commit(ma, [_rec(0)], [])
    c = StoreRunDir(url)  # a later run takes over: a's next commit is refused, nothing is lost
    mc = c.prepare()
    c.save_manifest(mc)
    with pytest.raises(RunLocked):
        a.commit(ma, [_rec(1)], [])
    assert StoreRunDir(url).committed_ids() == {"r0"}
    fs, root = store.filesystem(url)
    assert [p.rsplit("/", 1)[-1][:10] for p in fs.ls(f"{root}/results")] == ["part-00001"]


def test_a_failed_put_mid_commit_keeps_the_earlier_commits(s3_env, monkeypatch):
    import pytest

    from jobrunner.errors import StoreError
    from jobrunner.io.store_rundir import FAULT_PUT_ENV, StoreRunDir

    url = f"{s3_env}/run"
    rd = StoreRunDir(url)
    m = rd.prepare()
    rd.commit(m, [_rec(0)], [])
    monkeypatch.setenv(FAULT_PUT_ENV, "shard:2")  # the errors object of commit 2 is written
    with pytest.raises(StoreError, match="injected"):
        rd.commit(m, [_rec(1), _rec(2, "error")], [_err(2)])
    monkeypatch.delenv(FAULT_PUT_ENV)
    again = StoreRunDir(url)
    m2 = again.prepare()
    assert again.committed_ids() == {"r0"} and list(again.iter_errors()) == []
    again.commit(m2, [_rec(1), _rec(2, "error")], [_err(2)])
    again.mark_success(m2)
    fs, root = store.filesystem(url)
    assert len(fs.ls(f"{root}/errors")) == 1  # the failed commit's errors object is collected
    assert StoreRunDir(url).committed_ids() == {"r0", "r1", "r2"}


def test_a_prefix_holding_other_objects_is_refused(s3_env):
    import pytest

    from jobrunner.errors import RunDirError
    from jobrunner.io.store_rundir import StoreRunDir

    f, root = store.filesystem(f"{s3_env}/mine")
    f.pipe_file(f"{root}/notes.txt", b"the user's")
    with pytest.raises(RunDirError, match="holds no jobrunner run .* notes.txt"):
        StoreRunDir(f"{s3_env}/mine").check_ours()
    StoreRunDir(f"{s3_env}/empty").check_ours()  # an empty prefix is fine


def test_a_prefix_inside_another_run_is_refused(s3_env):
    """A run's prefix under another run's (its results/, or any folder below it) is refused, as
    locally: --restart or the finish of either would delete the other's objects."""
    import pytest

    from jobrunner.errors import RunDirError
    from jobrunner.io.store_rundir import StoreRunDir

    url = f"{s3_env}/outer/run"
    rd = StoreRunDir(url)
    m = rd.prepare()
    rd.save_manifest(m)
    rd.commit(m, [_rec(0)], [])
    for inside in ("sub", "results/x", "a/b/c"):
        with pytest.raises(RunDirError, match=f"inside the run directory {url}:"):
            StoreRunDir(f"{url}/{inside}").check_ours()
    StoreRunDir(f"{s3_env}/outer/run-2").check_ours()  # a sibling, and the run itself, are fine
    StoreRunDir(url).check_ours()


def test_a_store_without_conditional_writes_warns_and_checks_first(s3_env, caplog):
    import pytest

    from jobrunner.errors import RunLocked
    from jobrunner.io.store_rundir import StoreRunDir

    url = f"{s3_env}/run"
    a, b = StoreRunDir(url), StoreRunDir(url)
    a.conditional = b.conditional = False  # as on a store fs.CONDITIONAL_CREATE lacks
    ma, mb = a.prepare(), b.prepare()
    assert "no conditional writes; run one job at a time" in caplog.text
    a.save_manifest(ma)
    with pytest.raises(RunLocked):  # the existence check still catches a run that came later
        b.save_manifest(mb)
