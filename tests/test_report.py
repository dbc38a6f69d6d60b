"""Reports of a real run: totals equal the sums over rows, in every report; HTML renders.

One small job (7 rows, one an exact duplicate, 8 new tokens each, 2 sequences at a time so
later rows find the chat header in the prefix cache) runs once with the real
built-in model; the tests read what it left in the run directory.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.telemetry import browser

pytestmark = pytest.mark.slow
SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"

JOB = """name: report-test
model: {{source: smollm2-135m-instruct, dtype: float32, max_model_len: 1024}}
input: {{path: {input}, id_column: id, prompt: {{column: prompt}}}}
generation: {{max_new_tokens: 8, temperature: 0.0}}
output: {{path: {out}, format: parquet, shard_rows: 3}}
engine: {{kind: paged, kv_cache_bytes: 50000000, max_num_seqs: 2}}
cost: {{gpu_hour_usd: 2.0}}
"""


class _Recorder(http.server.BaseHTTPRequestHandler):
    bodies: list = []

    def do_PUT(self):  # noqa: N802
        _Recorder.bodies.append(
            self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        )
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    rows = [
        r for r in pq.read_table(SAMPLES / "prompts.parquet").to_pylist() if r["kind"] == "question"
    ][:6]
    rows.append({**rows[0], "id": "duplicate-of-first"})
    pq.write_table(
        pa.Table.from_pylist([{"id": r["id"], "prompt": r["prompt"]} for r in rows]),
        tmp / "in.parquet",
    )
    job = tmp / "job.yaml"
    job.write_text(JOB.format(input=tmp / "in.parquet", out=tmp / "out"))
    cli = CliRunner()
    server = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # a device this job has never run on: the estimate has no profile (earlier tests' runs
    # recorded theirs into the session's profile folder)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JOBRUNNER_PROFILE_DIR", str(tmp / "profiles"))
        est = cli.invoke(app, ["estimate", str(job)])
        assert est.exit_code == 0, est.output
        try:
            res = cli.invoke(
                app, ["run", str(job), "--pushgateway", f"http://127.0.0.1:{server.server_port}"]
            )
        finally:
            server.shutdown()
    assert res.exit_code == 0, res.output
    return tmp / "out"


def _rows(out):
    return pq.read_table(out / "results").to_pylist()


def _report(out):
    return json.loads((out / "report.json").read_text())


def test_report_totals_equal_the_sums_over_rows(run):
    rows, r = _rows(run), _report(run)
    assert r["rows"]["succeeded"] == len(rows) == 7
    assert r["tokens"]["prompt"] == sum(x["prompt_tokens"] for x in rows)
    assert r["tokens"]["cached"] == sum(x["cached_tokens"] for x in rows)
    assert r["tokens"]["completion"] == sum(x["completion_tokens"] for x in rows)
    assert r["cost"]["cost_usd"] == pytest.approx(sum(x["cost_usd"] for x in rows), rel=1e-12)
    assert r["cost"]["usd_per_1m_input_tokens"] == pytest.approx(
        r["cost"]["cost_usd"] / r["tokens"]["prompt"] * 1e6
    )
    # The duplicate rode along: it and its twin split one computation's cost.
    by_id = {x["id"]: x for x in rows}
    dup = by_id["duplicate-of-first"]
    (first,) = [x for x in rows if x["prompt"] == dup["prompt"] and x["id"] != dup["id"]]
    assert dup["cost_usd"] == pytest.approx(first["cost_usd"])
    assert r["engine_stats"]["deduplicated"] == 1
    assert r["cost"]["dedup_saved_usd"] > 0
    assert r["tokens"]["cached"] > 0 and r["cost"]["cache_saved_usd"] > 0  # the shared chat header


def test_markdown_and_prometheus_show_the_same_totals(run):
    r, md = _report(run), (run / "report.md").read_text()
    assert (
        f"| prompt tokens (cached) | {r['tokens']['prompt']:,} ({r['tokens']['cached']:,}) |" in md
    )
    assert f"| $ per 1M input tokens | ${r['cost']['usd_per_1m_input_tokens']:,.4f} |" in md
    assert "## Where the time went" in md and "## Estimate vs actual" in md
    # which compute dtype ran, and why (here the job file names it)
    assert r["model_memory"]["dtype"] == "float32"
    assert "| compute dtype | float32 (model.dtype) |" in md
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families((run / "metrics.prom").read_text())
        for s in f.samples
        if s.name != "jobrunner_request_success_total"
    }
    assert samples["jobrunner_prompt_tokens_total"] == r["tokens"]["prompt"]
    assert samples["jobrunner_generation_tokens_total"] == r["tokens"]["completion"]
    assert samples["jobrunner_cost_usd_total"] == pytest.approx(r["cost"]["cost_usd"])
    # Per-row latencies are histograms with one observation per row, step times one per step.
    assert samples["jobrunner_time_to_first_token_seconds_count"] == 7
    assert samples["jobrunner_time_per_output_token_seconds_count"] == 7
    assert samples["jobrunner_step_duration_seconds_count"] == r["engine_stats"]["steps"]
    # --pushgateway pushed the same figures at the end of the run
    (pushed,) = _Recorder.bodies
    assert (
        f'jobrunner_prompt_tokens_total{{job_name="report-test"}} {float(r["tokens"]["prompt"])}'
        in pushed
    )


def test_timelines_and_time_breakdown(run):
    steps = pq.read_table(run / "telemetry" / "steps.parquet").to_pylist()
    r = _report(run)
    assert len(steps) == r["engine_stats"]["steps"]
    rows = _rows(run)
    # Every computed prompt token went through a step once; the duplicate computed nothing, and
    # the report's computed prompt tokens do not count it.
    assert r["engine_stats"]["preemptions"] == 0
    assert sum(s["prefill_tokens"] for s in steps) == r["tokens"]["computed_prompt"]
    assert r["tokens"]["computed_prompt"] < sum(
        x["prompt_tokens"] - x["cached_tokens"] for x in rows
    )
    assert sum(s["decode_tokens"] for s in steps) > 0
    host = [
        d
        for d in pq.read_table(run / "telemetry" / "device.parquet").to_pylist()
        if d["device"] == "host"
    ]
    assert len(host) >= 2 and all(d["mem_used_bytes"] > 0 for d in host)
    b = r["time"]["breakdown"]["seconds"]
    assert sum(b.values()) == pytest.approx(r["time"]["wall_seconds"], rel=1e-6)


def test_each_row_pays_for_its_own_work_and_the_rows_add_up(run):
    rows = pq.read_table(run / "telemetry" / "rows.parquet").to_pylist()
    r = _report(run)
    assert len(rows) == 7
    assert sum(x["cost_usd"] for x in rows) == pytest.approx(r["cost"]["cost_usd"], rel=1e-12)
    steps = pq.read_table(run / "telemetry" / "steps.parquet").to_pylist()
    # Every measured step second went to a row (the duplicate pair splits one row's share).
    own = sum(x["device_seconds"] / x["shared_with"] for x in rows)
    assert own == pytest.approx(sum(s["step_seconds"] for s in steps), rel=1e-3)
    assert all(x["prefill_tokens"] + x["decode_tokens"] > 0 for x in rows)
    assert all(x["first_token_seconds"] > 0 for x in rows)
    assert r["cost"]["price_unit"] == "vCPU-hour" and r["device"]["unit_hours"] == "vCPU-hours"


def test_estimate_counts_the_same_tokens_and_the_report_compares(run):
    est, r = json.loads((run / "estimate.json").read_text()), _report(run)
    assert est["rows"] == r["rows"]["total"] == 7
    assert est["prompt_tokens"] == r["tokens"]["prompt"]
    assert est["deduplicated"] == 1
    assert est["completion_tokens"] == 7 * 8  # the bound: max_new_tokens per row
    f = r["estimate"]["figures"]
    assert f["prompt_tokens"]["error_fraction"] == 0.0
    assert f["cost_usd"]["actual"] == r["cost"]["cost_usd"]
    assert "roofline default" in r["estimate"]["throughput_source"]


def test_report_command_rebuilds_every_report_without_a_model(run, monkeypatch):
    import jobrunner.engine.loader as loader

    before = _report(run)
    for name in ("report.json", "report.md", "report.html", "metrics.prom"):
        (run / name).unlink()
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    res = CliRunner().invoke(app, ["report", str(run)])
    assert res.exit_code == 0, res.output
    assert _report(run) == before
    assert all((run / n).is_file() for n in ("report.md", "report.html", "metrics.prom"))


def test_html_is_self_contained(run):
    html = (run / "report.html").read_text()
    assert not re.search(r"<script[^>]+src=[\"']https?:", html)  # plotly inlined, no CDN
    assert html.count("Plotly.newPlot") == 6
    assert "per 1M tokens" in html and "saved by the prefix cache" in html
    assert "Weights and KV cache" in html and "Cost per row against its work" in html
    # A CPU run: the device panel is the host's, in the units it has.
    assert "(GPU)" not in html and "W or bytes" not in html
    assert "Host CPU utilisation and memory" in html


@pytest.mark.skipif(browser.find_chromium() is None, reason="chromium is not installed")
def test_html_renders_its_charts_in_headless_chromium(run):
    dom, log = browser.dump_dom(run / "report.html")
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-charts="6"' in body
    assert 'data-errors=""' in body
    assert browser.console_errors(log) == []
    assert dom.count('class="main-svg"') >= 6
