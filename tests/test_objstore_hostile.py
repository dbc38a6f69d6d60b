"""Hostile cases of corpora and run directories on S3, through the real CLI against a real S3
API server (moto): a run directory inside the input prefix, a store that is unreachable, a
bucket that does not exist, a server that goes away mid-run."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml
from crashkit import CLI, env, reference, run, start, summary
from s3kit import TcpProxy, free_port, serving
from test_objstore_jobs import assert_no_garbage, commits, s3_job, store_rows

from jobrunner.io import fs as store

pytestmark = pytest.mark.slow


def _retarget(job, **paths: str) -> None:
    """Point the job's input.path and/or output.path elsewhere."""
    spec = json.loads(job.read_text())
    for section, path in paths.items():
        spec[section]["path"] = path
    job.write_text(json.dumps(spec))


@pytest.mark.parametrize("pattern", ["", "/**/*.jsonl"])
def test_a_run_directory_inside_the_input_prefix_is_never_read_as_input(
    tmp_path, s3_bucket, pattern
):
    """output.path under input.path: the run's own records, shards and reports are objects
    under the input prefix; neither the run that writes them nor a rerun reads them as rows."""
    _, expected = reference("static")
    job, _ = s3_job(tmp_path, s3_bucket)
    url = f"{s3_bucket}/corpus/run"
    _retarget(job, input=f"{s3_bucket}/corpus{pattern}", output=url)
    p = run(job)
    assert p.returncode == 0, p.stderr[-3000:]
    assert store_rows(url) == expected
    p = run(job)
    assert p.returncode == 0, p.stderr[-3000:]
    assert summary(p.stdout)["status"] == "nothing_to_do"
    assert summary(p.stdout)["rows"]["succeeded"] == len(expected[0])


def test_a_glob_over_partition_folders_lists_no_folder_for_run_records(s3_env, monkeypatch):
    """Only objects named as a run's are checked for a run directory above them: a glob over
    many partition folders costs no listing a folder (each one a LIST request)."""
    from jobrunner.formats import input_files
    from jobrunner.io import fs as store
    from jobrunner.io import identity
    from jobrunner.io.rundir import OWN_FILES, OWN_FOLDER_FILES

    f, root = store.filesystem(f"{s3_env}/parts")
    f.pipe({f"{root}/date=2024-01-{d:02d}/part-0.jsonl": b'{"id": "a"}\n' for d in range(1, 13)})
    listed = []
    real = identity._holds_records
    monkeypatch.setattr(identity, "_holds_records", lambda d: listed.append(d) or real(d))
    assert len(input_files(f"{s3_env}/parts/*/*.jsonl")) == 12
    assert listed == []
    for name in OWN_FILES:  # what a run writes is recognised, so its folders are checked
        inner = f"{name}/x" if name in OWN_FOLDER_FILES else name
        assert identity.RUN_OBJECT.search(f"s3://b/run/{inner}"), name


def test_a_prefix_names_the_objects_it_does_not_read(s3_env, caplog):
    """Directory markers and a writer's `_SUCCESS` are skipped; notes are named in a warning,
    as in a local folder, never dropped silently."""
    from jobrunner.formats import input_files
    from jobrunner.io import fs as store

    f, root = store.filesystem(f"{s3_env}/mixed")
    f.pipe({f"{root}/": b"", f"{root}/sub/": b"", f"{root}/_SUCCESS": b"", f"{root}/n.txt": b"x"})
    f.pipe({f"{root}/sub/a.jsonl": b'{"id": "a", "prompt": "p"}\n', f"{root}/b.csv": b"id\nb\n"})
    url = f"{s3_env}/mixed"
    assert input_files(f"{url}/") == input_files(url) == [f"{url}/b.csv", f"{url}/sub/a.jsonl"]
    assert "1 files of no input format are not read (n.txt)" in caplog.text


def test_a_named_format_reads_a_prefixs_suffixless_objects_and_no_others(s3_env):
    """With input.format named, Hive's suffix-less objects are read as it, and a note, another
    format's object or a folder marker still are not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobrunner.formats import input_files
    from jobrunner.io import fs as store

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": ["a"], "text": ["t"]}), sink)
    data = sink.getvalue().to_pybytes()
    f, root = store.filesystem(f"{s3_env}/hive")
    f.pipe({f"{root}/{k}": data for k in ("part-0.parquet", "000000_0", "sub/x.parquet")})
    f.pipe({f"{root}/README.txt": b"notes", f"{root}/sub/": b""})
    url = f"{s3_env}/hive"
    want = [f"{url}/000000_0", f"{url}/part-0.parquet", f"{url}/sub/x.parquet"]
    assert input_files(url, "parquet") == input_files(f"{url}/", "parquet") == want
    assert input_files(url) == want[1:]


def _cli(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env(**extra_env), timeout=600
    )


def test_a_store_that_cannot_be_reached_is_a_temporary_error(tmp_path, s3_bucket):
    """Connection refused (the server is down, or the endpoint is wrong) exits 75 naming the
    endpoint, from every command: never 70, never a traceback."""
    job, url = s3_job(tmp_path, s3_bucket)
    gone = f"http://127.0.0.1:{free_port()}"
    for args in (["run", str(job)], ["validate", str(job)], ["estimate", str(job)]):
        p = _cli(*args, AWS_ENDPOINT_URL=gone)
        assert p.returncode == 75, (args, p.stderr[-2000:])
        assert f"cannot reach the object store at {gone}" in summary(p.stdout)["error"]
    p = _cli("report", url, AWS_ENDPOINT_URL=gone)
    assert p.returncode == 75, p.stderr[-2000:]
    _retarget(job, input=str(tmp_path / "in.jsonl"))  # only the run directory is on the store
    for command in ("run", "validate"):
        p = _cli(command, str(job), AWS_ENDPOINT_URL=gone)
        assert p.returncode == 75, p.stderr[-2000:]  # not 'bucket ... does not exist'
        assert f"cannot reach the object store at {gone}" in summary(p.stdout)["error"]


def test_an_untrusted_tls_certificate_is_a_configuration_error(tmp_path, s3_bucket):
    """A store behind a certificate the client does not trust (moto over TLS with its own
    self-signed one) is 78 saying so: running the same command again cannot help."""
    import sys

    port = free_port()
    args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port), "--ssl"]
    with serving(args, port, "moto --ssl"):
        job, _ = s3_job(tmp_path, s3_bucket)
        for command in ("validate", "run"):
            p = _cli(command, str(job), AWS_ENDPOINT_URL=f"https://127.0.0.1:{port}")
            assert p.returncode == 78, p.stderr[-2000:]
            assert "TLS certificate is not trusted" in summary(p.stdout)["error"]


def test_a_bucket_that_does_not_exist_is_named_before_any_work(tmp_path, s3_bucket):
    job, _ = s3_job(tmp_path, s3_bucket)
    for command, path in (("run", "corpus/*.jsonl"), ("validate", "corpus")):
        _retarget(job, input=f"s3://no-such-input-bucket/{path}")
        p = _cli(command, str(job))
        assert p.returncode == 65, p.stderr[-2000:]  # no input files, and why
        assert summary(p.stdout)["error"] == (
            f"input.path: no input files found at 's3://no-such-input-bucket/{path}':"
            " bucket no-such-input-bucket does not exist"
        )
    job, _ = s3_job(tmp_path, s3_bucket)
    _retarget(job, output="s3://no-such-output-bucket/run")
    for command in ("run", "validate"):
        p = _cli(command, str(job))
        assert p.returncode == 78, p.stderr[-2000:]
        assert "bucket no-such-output-bucket does not exist" in summary(p.stdout)["error"]
        assert "loaded smollm2" not in p.stderr  # refused before the model loads


def test_a_store_that_goes_away_mid_run_stops_75_and_the_rerun_completes(
    tmp_path, s3_bucket, moto_server
):
    """The server goes away while the job commits: exit 75 naming the store; once it is back,
    the same command completes with every row exactly once."""
    _, expected = reference("static")
    job, url = s3_job(tmp_path, s3_bucket)
    proxy = TcpProxy(int(moto_server.rsplit(":", 1)[1]))
    proxy.start()
    try:
        proc = start(job, AWS_ENDPOINT_URL=proxy.url)
        deadline = time.monotonic() + 300
        while commits(url) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proxy.stop()
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 75, err[-3000:]
        assert "cannot reach the object store" in summary(out)["error"], err[-3000:]
        proxy.start()
        p = run(job, AWS_ENDPOINT_URL=proxy.url)
    finally:
        proxy.stop()
    assert p.returncode == 0, p.stderr[-3000:]
    assert store_rows(url) == expected
    assert_no_garbage(url)


def test_refused_or_missing_credentials_are_named_not_a_crash(tmp_path, moto_server_with_auth):
    """A store that refuses the credentials, or none to give it: 78 saying which, from
    `validate` and `report` alike."""
    spec = {"input": {"path": "s3://corpus-bucket/in/*.jsonl"}, "output": {"path": "s3://x/run"}}
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(spec))
    at = {"AWS_ENDPOINT_URL": moto_server_with_auth, "AWS_EC2_METADATA_DISABLED": "true"}
    at |= {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    at |= {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_DEFAULT_REGION": "us-east-1"}
    wrong = {"AWS_ACCESS_KEY_ID": "AKIAWRONG", "AWS_SECRET_ACCESS_KEY": "wrong"}
    for args in (["validate", str(job)], ["report", "s3://x/run"]):
        p = _cli(*args, **at, **wrong)
        assert p.returncode == 78, p.stderr[-2000:]
        assert "refused the request" in summary(p.stdout)["error"]
        assert "InvalidAccessKeyId" in summary(p.stdout)["error"]
    p = _cli("validate", str(job), **at, AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="")
    assert p.returncode == 78, p.stderr[-2000:]
    assert summary(p.stdout)["error"].startswith("no credentials for the object store")
    p = _cli("validate", str(job), **at, AWS_PROFILE="no-such-profile")
    assert p.returncode == 78, p.stderr[-2000:]
    assert "The config profile (no-such-profile) could not be found" in p.stdout


def test_a_changed_object_is_refused_naming_the_run(tmp_path, s3_bucket):
    """An input object rewritten between two runs is refused as locally, the message naming
    the run's URL (not its local staging folder) and the row; --retry-errors, offered for a
    change to failed rows only, does not take a change to a row that succeeded."""
    job, url = s3_job(tmp_path, s3_bucket)
    p = run(job)
    assert p.returncode == 0, p.stderr[-3000:]
    f, root = store.filesystem(f"{s3_bucket}/corpus/in.jsonl")
    f.pipe_file(root, f.cat_file(root).replace(b"with apple.", b"with maple."))
    for command in ("run", "validate"):
        p = _cli(command, str(job))
        assert p.returncode == 78, p.stderr[-2000:]
        error = summary(p.stdout)["error"]
        assert error.startswith(f"{url} was started on a different input"), error
        assert "in.jsonl: content changed" in error and "rows changed: 1 ('r00')" in error
        assert "--retry-errors if only failed rows changed" in error
    p = run(job, "--retry-errors")
    assert p.returncode == 78, p.stderr[-2000:]
    error = summary(p.stdout)["error"]
    why = "--retry-errors cannot take it: 1 rows that succeeded changed or left the input ('r00')"
    assert why in error, error


def test_a_store_failing_under_a_parquet_reader_is_not_a_damaged_file(s3_env, monkeypatch):
    """The store going away between the listing and the read of a Parquet object is the
    store's failure (75), not 'not a readable Parquet file' (65, which says to repair it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobrunner.errors import StoreError
    from jobrunner.formats.parquet import read_parquet

    url = f"{s3_env}/in/a.parquet"
    f, p = store.filesystem(url)
    with f.open(p, "wb") as out:
        pq.write_table(pa.table({"id": ["a"], "prompt": ["x"]}), out)
    monkeypatch.setenv("AWS_ENDPOINT_URL", gone := f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StoreError, match=f"{url}: cannot reach the object store at {gone}"):
        list(read_parquet(url, 10))


def test_an_object_named_with_glob_characters_is_read_by_its_name(s3_env):
    """Keys may hold spaces, unicode, `=`, `+`, `%`, `#`, `?` and `[`: each object named in
    input.path is read, as a local file of that name is, and a prefix lists them all."""
    from jobrunner.formats import input_files, read_rows

    names = ["a b.jsonl", "ü€.jsonl", "x=1.jsonl", "p+q.jsonl", "pc%20.jsonl", "h#.jsonl"]
    names += ["q?.jsonl", "data[1].jsonl", "star*.jsonl"]
    f, root = store.filesystem(f"{s3_env}/in")
    f.pipe({f"{root}/{n}": b'{"id": "%d", "prompt": "p"}\n' % i for i, n in enumerate(names)})
    for n in names:
        assert input_files(f"{s3_env}/in/{n}") == [f"{s3_env}/in/{n}"], n
    assert sorted(input_files(f"{s3_env}/in")) == sorted(f"{s3_env}/in/{n}" for n in names)
    ids = sorted(r.values["id"] for r in read_rows(f"{s3_env}/in"))
    assert ids == sorted(str(i) for i in range(len(names)))


def test_an_output_prefix_made_as_a_console_folder_is_empty(tmp_path, s3_bucket):
    """A prefix created as a folder (the zero-byte `out/` marker a console makes) holds nothing
    of the user's: the run takes it, as it takes an empty local directory."""
    _, expected = reference("static")
    job, url = s3_job(tmp_path, s3_bucket)
    f, root = store.filesystem(url)
    f.pipe_file(f"{root}/", b"")
    p = _cli("validate", str(job))
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    p = run(job)
    assert p.returncode == 0, p.stderr[-3000:]
    assert store_rows(url) == expected


def test_restart_of_a_run_at_a_bucket_root_keeps_the_bucket(tmp_path, s3_bucket):
    """output.path s3://bucket: --restart removes the run's objects, never the bucket."""
    _, expected = reference("static")
    job, _ = s3_job(tmp_path, s3_bucket)
    url = f"{s3_bucket}-out"
    f, root = store.filesystem(url)
    f.mkdir(root)
    _retarget(job, output=url)
    for args in ((), ("--restart",)):
        p = run(job, *args)
        assert p.returncode == 0, p.stderr[-3000:]
        assert summary(p.stdout)["status"] == "done"
        assert store_rows(url) == expected


def test_init_writes_a_job_for_an_object_in_a_store(tmp_path, s3_bucket):
    """`jobrunner init s3://...` samples the object and writes a job naming its URL, which
    validates as it is; an object that is not there is named by its URL, not a mangled path."""
    url = f"{s3_bucket}/corpus/posts.jsonl"
    f, p = store.filesystem(url)
    f.pipe_file(p, b'{"id": "a", "prompt": "Say hi."}\n{"id": "b", "prompt": "Say bye."}\n')
    job = tmp_path / "posts.yaml"
    r = _cli("init", url, "-o", str(job))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert yaml.safe_load(job.read_text())["input"]["path"] == url
    r = _cli("validate", str(job))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    r = _cli("init", f"{s3_bucket}/corpus/none.jsonl", "-o", str(tmp_path / "none.yaml"))
    assert r.returncode == 65, r.stderr[-2000:]
    assert summary(r.stdout)["error"].startswith(f"{s3_bucket}/corpus/none.jsonl: no such file")


def test_a_write_the_store_denies_is_a_configuration_error(s3_env, monkeypatch):
    """AccessDenied on a PUT (a bucket policy, read-only credentials) is 78 naming the run and
    the code: running the same command again cannot succeed, so it is not 75."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    from jobrunner.errors import ConfigError, StoreError
    from jobrunner.io.store_rundir import StoreRunDir

    url = f"{s3_env}/run"
    rd = StoreRunDir(url)
    m = rd.prepare()
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "Put")

    def refuse(*args, **kwargs):
        raise translate_boto_error(denied)  # as s3fs raises it: a PermissionError, no errno

    monkeypatch.setattr(rd.fs, "pipe_file", refuse)
    with pytest.raises(ConfigError, match=f"{url}: the object store refused .*AccessDenied") as e:
        rd.save_manifest(m)
    assert not isinstance(e.value, StoreError)


def test_other_clients_errors_are_left_to_the_other_mappings():
    """An HTTP client's error holding a response object (huggingface_hub, requests) is not a
    store's: from_store_error answers None and does not fail on it."""
    from jobrunner.io.store_errors import from_store_error

    class HubError(Exception):
        def __init__(self) -> None:
            super().__init__("404 Client Error")
            self.response = object()

    assert from_store_error(HubError()) is None
    assert from_store_error(OSError(28, "No space left on device")) is None


def test_restart_keeps_a_users_objects_under_the_run_prefix(tmp_path, s3_bucket):
    """--restart deleted every object under the run's prefix, a user's notes beside the
    results included; as locally, it now refuses (78) naming them and removes nothing."""
    job, url = s3_job(tmp_path, s3_bucket)
    assert run(job).returncode == 0
    f, root = store.filesystem(url)
    f.pipe_file(f"{root}/notes.txt", b"mine")
    f.pipe_file(f"{root}/results/mine.csv", b"a,b\n")
    before = sorted(f.find(root))
    p = run(job, "--restart")
    assert p.returncode == 78, p.stderr[-3000:]
    error = summary(p.stdout)["error"]
    assert f"{url}/notes.txt" in error and f"{url}/results/mine.csv" in error
    assert sorted(f.find(root)) == before  # nothing removed
    f.rm([f"{root}/notes.txt", f"{root}/results/mine.csv"])
    p = run(job, "--restart")
    assert p.returncode == 0 and summary(p.stdout)["status"] == "done", p.stderr[-3000:]
