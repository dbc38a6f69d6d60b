"""metrics.prom parses with prometheus_client's parser; --pushgateway pushes the same metrics."""

from __future__ import annotations

import http.server
import threading

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
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "job_name")))] = (
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
    assert s[("jobrunner_cost_usd", ())] == pytest.approx(0.006)
    assert s[("jobrunner_duration_seconds", ())] == 12.0
    assert s[("jobrunner_last_success_timestamp_seconds", ())] > 1.7e9
    assert 'job_name="prom-test"' in text
    assert "_created" not in text


class _Recorder(http.server.BaseHTTPRequestHandler):
    pushes: list = []

    def do_PUT(self):  # noqa: N802  (http.server's naming)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _Recorder.pushes.append((self.command, self.path, body.decode()))
        self.send_response(200)
        self.end_headers()

    do_POST = do_PUT

    def log_message(self, *args):
        pass


def test_pushgateway_receives_the_same_metrics(run_dir):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        push_metrics(run_dir, f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    ((method, path, body),) = _Recorder.pushes
    assert method == "PUT"
    assert path == "/metrics/job/jobrunner/job_name/prom-test"
    assert _samples(body) == _samples((run_dir / "metrics.prom").read_text())
