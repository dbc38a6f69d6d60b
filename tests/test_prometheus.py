"""metrics.prom parses with prometheus_client's parser; --pushgateway pushes the same metrics."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobrunner.io.rundir import RunDir
from jobrunner.telemetry.prom import push_metrics
from jobrunner.telemetry.report import write_reports
from jobrunner.types import RowError


def _record(i: int, reason: str, completion: int) -> dict:
    return {
        "id": f"r{i}",
        "completion": "x",
        "finish_reason": reason,
        "prompt_tokens": 10 + i,
        "cached_tokens": 4,
        "completion_tokens": completion,
        "cost_usd": 0.001 * (i + 1),
        "model": "m",
    }


@pytest.fixture
def run_dir(tmp_path):
    """A finished run directory, written the way the committer writes one (no model)."""
    rd = RunDir(tmp_path / "run")
    m = rd.prepare()
    rd.commit(m, [_record(0, "stop", 5), _record(1, "length", 8)], [])
    rd.commit(m, [_record(2, "stop", 3)], [RowError("empty_prompt", "row 3: empty", None, "r3")])
    m.runs.append(
        {
            "job": "prom-test",
            "model": "m",
            "engine": "paged",
            "wall_seconds": 12.0,
            "load_seconds": 2.0,
            "engine_seconds": 9.0,
            "forward_seconds": 8.0,
            "steps": 3,
            "preemptions": 2,
            "device_name": "cpu",
            "device_kind": "cpu",
            "device_count": 2,
            "usd_per_hour": 0.1,
            "price_source": "test",
            "energy_kwh": None,
            "cache_saved_usd": 0.002,
            "dedup_saved_usd": 0.0,
        }
    )
    rd.mark_success(m)
    write_reports(rd)
    return rd.path


def _samples(text: str) -> dict:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {k: str(float(v)) if k == "le" else v for k, v in s.labels.items()}
            out[(s.name, tuple(sorted((k, v) for k, v in labels.items() if k != "job_name")))] = (
                s.value
            )
    return out


def test_metrics_file_parses_and_matches_the_rows(run_dir):
    text = (run_dir / "metrics.prom").read_text()
    s = _samples(text)
    assert s[("jobrunner_prompt_tokens_total", ())] == 10 + 11 + 12
    assert s[("jobrunner_generation_tokens_total", ())] == 16
    assert s[("jobrunner_request_success_total", (("finished_reason", "stop"),))] == 2
    assert s[("jobrunner_request_success_total", (("finished_reason", "length"),))] == 1
    assert s[("jobrunner_request_failure_total", ())] == 1
    assert s[("jobrunner_num_preemptions_total", ())] == 2
    assert s[("jobrunner_cost_usd_total", ())] == pytest.approx(0.006)
    assert s[("jobrunner_duration_seconds", ())] == 12.0
    assert s[("jobrunner_last_success_timestamp_seconds", ())] > 1.7e9
    assert 'job_name="prom-test"' in text
    assert "_created" not in text


@pytest.fixture
def pushgateway(tmp_path):
    """A real Prometheus Pushgateway (Debian's prometheus-pushgateway) on a free local port."""
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if binary is None:
        pytest.skip("no Pushgateway binary (apt-get install prometheus-pushgateway)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):  # up to 20 s on a loaded machine
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"the Pushgateway exited with {proc.returncode}")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_pushgateway_serves_the_pushed_metrics(run_dir, pushgateway):
    push_metrics(run_dir, pushgateway)
    text = urllib.request.urlopen(f"{pushgateway}/metrics", timeout=10).read().decode()
    served = {  # the gateway adds its grouping labels (job, instance) to every series
        (name, tuple(kv for kv in labels if kv[0] not in ("job", "instance"))): v
        for (name, labels), v in _samples(text).items()
        if name.startswith("jobrunner_")
    }
    assert served == _samples((run_dir / "metrics.prom").read_text())
    assert 'job="jobrunner"' in text and 'job_name="prom-test"' in text
