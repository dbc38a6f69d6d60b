"""gs:// and az:// as s3:// is (test_objstore_jobs.py): corpora and run directories against
real GCS and Azure Blob APIs on localhost (fake-gcs-server, Azurite; tests/cloudkit.py), the
jobs as subprocesses on the real model. Each test runs once a store (`store_root`)."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cloudkit import az_connection
from crashkit import CLI, env, reference, run, summary
from s3kit import free_port
from test_objstore_jobs import (
    kill9_and_a_failed_put_resume_to_each_row_once,
    s3_job,
    store_rows,
)

from jobrunner.io import fs as store


def _put(url: str, data: bytes) -> None:
    f, p = store.filesystem(url)
    f.pipe_file(p, data)


def _parquet(rows: list[dict]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


def _folder_marker(url: str) -> None:
    """A zero-byte `key/`, as the GCS console's "create folder" (and tools on Azure) make it;
    written with the service's own client where adlfs would drop the slash."""
    scheme, rest = url.split("://", 1)
    if scheme == "gs":
        _put(url + "/", b"")
        return
    import os

    from azure.storage.blob import BlobServiceClient

    container, key = rest.split("/", 1)
    client = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
    client.get_container_client(container).upload_blob(key + "/", b"")


def _cli(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env(**extra_env), timeout=600
    )


def _retarget(job, **paths: str) -> None:
    spec = json.loads(job.read_text())
    for section, path in paths.items():
        spec[section]["path"] = path
    job.write_text(json.dumps(spec))


# ------------------------------------------------------------------ listing


def test_a_prefix_lists_its_data_objects_by_the_scheme_written(store_root):
    """A prefix's JSONL and Parquet objects are its files, named with the scheme the path is
    written with (az://, not adlfs's abfs://; gcs:// stays gcs://); a writer's markers and
    temporaries, a console folder marker (which adlfs lists as an empty object) and a notes
    file are not; a glob and a key holding glob characters read as on S3."""
    from jobrunner.formats import input_files

    url = f"{store_root}/in"
    _put(f"{url}/a.jsonl", b'{"id": "a", "prompt": "x"}\n')
    _put(f"{url}/b.parquet", _parquet([{"id": "b", "prompt": "y"}]))
    _put(f"{url}/[1].jsonl", b'{"id": "c", "prompt": "z"}\n')
    _put(f"{url}/_SUCCESS", b"")
    _put(f"{url}/_temporary/0/part-0.jsonl", b'{"id": "t", "prompt": "t"}\n')
    _put(f"{url}/notes.txt", b"the user's")
    _folder_marker(f"{url}/empty")
    want = [f"{url}/[1].jsonl", f"{url}/a.jsonl", f"{url}/b.parquet"]
    assert input_files(url) == want
    assert input_files(url, "jsonl") == want  # the marker is no suffix-less file either
    assert input_files(f"{url}/*.jsonl") == [want[0], want[1]]
    assert input_files(f"{url}/[1].jsonl") == [want[0]]
    alias = {"gs": "gcs", "az": "abfs"}[store_root.split(":")[0]]
    other = url.replace(store_root.split(":")[0], alias, 1)
    assert input_files(other) == [w.replace(url, other, 1) for w in want]


def test_a_store_url_naming_an_azure_account_is_refused(tmp_path):
    """adlfs reads `abfss://container@account.dfs.core.windows.net/...` in the account its
    credentials name, whatever the URL says: refused (78) naming the form that works."""
    job = tmp_path / "job.yaml"
    url = "abfss://data@otheraccount.dfs.core.windows.net/corpus/*.jsonl"
    job.write_text(json.dumps({"input": {"path": url}}))
    p = _cli("validate", str(job))
    assert p.returncode == 78, p.stderr[-2000:]
    error = summary(p.stdout)["error"]
    assert "write the URL as abfss://data/..." in error and "(otheraccount)" in error


# ------------------------------------------------------------------ the commit protocol


def test_a_store_run_directory_uses_the_stores_conditional_create(store_root, caplog):
    """Both stores create a commit record only where none is (GCS ifGenerationMatch=0, Azure
    If-None-Match: *): no one-job-at-a-time warning, and a run that read the prefix before
    another claimed the next record is refused by the store itself (no existence check
    is made first on such a store)."""
    from jobrunner.errors import RunLocked
    from jobrunner.io.store_rundir import StoreRunDir

    url = f"{store_root}/run"
    a, b = StoreRunDir(url), StoreRunDir(url)
    assert a.conditional and b.conditional
    ma, mb = a.prepare(), b.prepare()
    assert "no conditional writes" not in caplog.text
    a.save_manifest(ma)
    with pytest.raises(RunLocked, match="another jobrunner"):
        b.save_manifest(mb)
    f, root = store.filesystem(url)
    with pytest.raises(FileExistsError):
        f.pipe_file(f"{root}/commits/0000000000.json", b"{}", mode="create")


def test_an_output_prefix_is_checked_on_the_store(store_root):
    """The store says whether a bucket (container) exists; a prefix made as a console folder
    is empty, one holding the user's objects is refused."""
    from jobrunner.errors import RunDirError
    from jobrunner.io.store_rundir import StoreRunDir

    scheme = store_root.split("://")[0]
    assert store.missing_bucket(f"{store_root}/x") is None
    assert store.missing_bucket(f"{scheme}://no-such-bucket/x") == "no-such-bucket"
    _folder_marker(f"{store_root}/made")
    StoreRunDir(f"{store_root}/made").check_ours()
    _put(f"{store_root}/mine/notes.txt", b"the user's")
    with pytest.raises(RunDirError, match="holds no jobrunner run .* notes.txt"):
        StoreRunDir(f"{store_root}/mine").check_ours()


# ------------------------------------------------------------------ whole jobs


@pytest.mark.slow
def test_a_job_from_the_store_to_the_store_equals_the_local_run(tmp_path, store_root):
    """A prefix of JSONL and Parquet objects to a run directory in the same store: exit 0,
    the rows the local run has, `report` and `validate` read it, a rerun has nothing to do."""
    _, (rows, errors) = reference("static")
    job, url = s3_job(tmp_path, store_root)
    _put(f"{store_root}/corpus/more.parquet", _parquet([{"id": "p0", "prompt": "Say yes."}]))
    _retarget(job, input=f"{store_root}/corpus")
    p = run(job)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "no conditional writes" not in p.stderr
    # the store client's own request log (the Azure SDK's, headers and all) is not the user's:
    # it filled a pipe and hung a run whose stderr nobody read
    assert "Request headers" not in p.stderr and len(p.stderr) < 20_000, p.stderr[-2000:]
    assert summary(p.stdout)["output"] == url
    got_rows, got_errors = store_rows(url)
    assert [r for r in got_rows if r[0] != "p0"] == rows and got_errors == errors
    assert [r[0] for r in got_rows if r[0] == "p0"] == ["p0"]
    f, root = store.filesystem(url)
    manifest = json.loads(f.cat_file(f"{root}/manifest.json"))
    assert manifest["counts"] == {"succeeded": 25, "failed": 2}
    assert f.exists(f"{root}/_SUCCESS") and f.exists(f"{root}/errors.jsonl")
    p = _cli("report", url)
    assert p.returncode == 0, p.stderr[-2000:]
    p = run(job)
    assert p.returncode == 0 and summary(p.stdout)["status"] == "nothing_to_do", p.stderr[-2000:]
    p = _cli("validate", str(job))
    assert p.returncode == 0 and summary(p.stdout)["output_state"] == "finished", p.stderr


@pytest.mark.slow
def test_kill9_and_a_failed_put_resume_to_each_row_once(tmp_path, store_root):
    kill9_and_a_failed_put_resume_to_each_row_once(tmp_path, store_root)


# ------------------------------------------------------------------ store errors, by meaning


def _unreachable(store_root: str) -> dict[str, str]:
    """The environment pointing the store's client at a port where nothing listens."""
    gone = f"http://127.0.0.1:{free_port()}"
    if store_root.startswith("gs://"):
        return {"STORAGE_EMULATOR_HOST": gone}
    return {"AZURE_STORAGE_CONNECTION_STRING": az_connection(gone)}


@pytest.mark.slow
def test_a_store_that_cannot_be_reached_is_a_temporary_error(tmp_path, store_root):
    """Connection refused, after the client's own retries: 75, never 70 or a traceback."""
    job, _ = s3_job(tmp_path, store_root)
    p = _cli("run", str(job), **_unreachable(store_root))
    assert p.returncode == 75, p.stderr[-2000:]
    assert "cannot reach the object store" in summary(p.stdout)["error"]
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_a_bucket_or_container_that_does_not_exist_is_named_before_any_work(tmp_path, store_root):
    scheme = store_root.split("://")[0]
    bucket = {"gs": "bucket", "az": "container"}[scheme]
    job, _ = s3_job(tmp_path, store_root)
    _retarget(job, input=f"{scheme}://no-such-input/corpus")
    p = _cli("validate", str(job))
    assert p.returncode == 65, p.stderr[-2000:]  # no input files, and why
    assert summary(p.stdout)["error"] == (
        f"input.path: no input files found at '{scheme}://no-such-input/corpus':"
        f" {bucket} no-such-input does not exist"
    )
    job, _ = s3_job(tmp_path, store_root)
    _retarget(job, output=f"{scheme}://no-such-output/run")
    p = _cli("run", str(job))
    assert p.returncode == 78, p.stderr[-2000:]
    error = summary(p.stdout)["error"]
    assert f"output.path {scheme}://no-such-output/run: {bucket} no-such-output does not" in error
    assert "loaded smollm2" not in p.stderr  # refused before the model loads


@pytest.mark.slow
def test_azure_credentials_refused_or_missing_are_named(tmp_path, az_container, azurite_server):
    """A wrong account key (Azurite answers 403 AuthorizationFailure, Azure 403
    AuthenticationFailed), or no account at all: 78 saying which, from `validate` and
    `report`."""
    job, url = s3_job(tmp_path, az_container)
    wrong = az_connection(azurite_server, key="d3Jvbmcga2V5" * 7 + "AA==")
    for args in (["validate", str(job)], ["report", url]):
        p = _cli(*args, AZURE_STORAGE_CONNECTION_STRING=wrong)
        assert p.returncode == 78, p.stderr[-2000:]
        assert "refused the request" in summary(p.stdout)["error"]
        assert "AZURE_STORAGE_CONNECTION_STRING" in summary(p.stdout)["error"]
    p = _cli("validate", str(job), AZURE_STORAGE_CONNECTION_STRING="")
    assert p.returncode == 78, p.stderr[-2000:]
    assert "no Azure storage account to connect to" in summary(p.stdout)["error"]


class _RefusingGcs(http.server.BaseHTTPRequestHandler):
    """Answers every request as GCS answers a credential without access (fake-gcs-server
    checks no credentials): 403 with the JSON API's error body."""

    def do_GET(self) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": 403,
                    "message": "ci@p.iam.gserviceaccount.com does not have"
                    " storage.objects.list access to the Google Cloud Storage bucket.",
                    "errors": [{"reason": "forbidden", "domain": "global"}],
                }
            }
        ).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PUT = do_HEAD = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
def test_gcs_refusing_the_credentials_is_a_configuration_error(tmp_path, gs_bucket):
    job, url = s3_job(tmp_path, gs_bucket)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusingGcs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        at = f"http://127.0.0.1:{server.server_address[1]}"
        for args in (["validate", str(job)], ["report", url]):
            p = _cli(*args, STORAGE_EMULATOR_HOST=at)
            assert p.returncode == 78, p.stderr[-2000:]
            error = summary(p.stdout)["error"]
            assert "refused the request" in error and "GOOGLE_APPLICATION_CREDENTIALS" in error
    finally:
        server.shutdown()
