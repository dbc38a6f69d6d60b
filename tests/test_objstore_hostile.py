"""Hostile cases of corpora and run directories on S3, through the real CLI against a real S3
API server (moto): a run directory inside the input prefix, a store that is unreachable, a
bucket that does not exist, a server that goes away mid-run."""

from __future__ import annotations

import json

import pytest
from crashkit import reference, run, summary
from test_objstore_jobs import s3_job, store_rows

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


def test_a_prefix_names_the_objects_it_does_not_read(s3_env, caplog):
    """Directory markers are skipped; `_SUCCESS` and notes are named in a warning, as in a
    local folder, never dropped silently."""
    from jobrunner.formats import input_files
    from jobrunner.io import fs as store

    f, root = store.filesystem(f"{s3_env}/mixed")
    f.pipe({f"{root}/": b"", f"{root}/sub/": b"", f"{root}/_SUCCESS": b"", f"{root}/n.txt": b"x"})
    f.pipe({f"{root}/sub/a.jsonl": b'{"id": "a", "prompt": "p"}\n', f"{root}/b.csv": b"id\nb\n"})
    url = f"{s3_env}/mixed"
    assert input_files(f"{url}/") == input_files(url) == [f"{url}/b.csv", f"{url}/sub/a.jsonl"]
    assert "2 files of no input format are not read (_SUCCESS, n.txt)" in caplog.text
