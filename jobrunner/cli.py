"""The command line: run, validate, estimate, report. No logic here; errors become exit codes.

Logs go to stderr; the last line on stdout is a one-line JSON summary (for Airflow's XCom).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from jobrunner import errors

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Offline batch LLM inference: a job file in, completions and a cost report out.",
)
log = logging.getLogger("jobrunner")

JobArg = Annotated[Path, typer.Argument(help="the job file (YAML)")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override a key: key.path=value")]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("transformers", "httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")


def _fail(e: BaseException) -> None:
    if isinstance(e, errors.JobError):
        typer.echo(f"error: {e}", err=True)
        _print_summary(
            {"status": "error", "exit_code": e.exit_code, "error": str(e).splitlines()[0]}
        )
        raise typer.Exit(e.exit_code)
    log.exception("internal error")
    _print_summary({"status": "error", "exit_code": errors.EXIT_INTERNAL, "error": repr(e)})
    raise typer.Exit(errors.EXIT_INTERNAL)


def _print_summary(summary: dict) -> None:
    sys.stdout.write(json.dumps(summary, default=str) + "\n")
    sys.stdout.flush()


@app.command()
def run(
    job: JobArg,
    set_: SetOpt = None,
    restart: Annotated[bool, typer.Option(help="discard earlier results in output.path")] = False,
    retry_errors: Annotated[bool, typer.Option(help="rerun only the rows that failed")] = False,
    executor: Annotated[str | None, typer.Option(help="local | ray")] = None,
    pushgateway: Annotated[
        str | None,
        typer.Option(help="push the job's metrics to this Prometheus Pushgateway at the end"),
    ] = None,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
) -> None:
    """Run a job: every input row gets a completion; resumes where an earlier run stopped."""
    _setup_logging(verbose)
    try:
        from jobrunner.config import load_job
        from jobrunner.executors import run_with_executor
        from jobrunner.pipeline import RunOptions

        cfg = load_job(job, list(set_ or []), executor=executor)
        summary = run_with_executor(cfg, RunOptions(restart=restart, retry_errors=retry_errors))
    except (Exception, KeyboardInterrupt) as e:
        if isinstance(e, KeyboardInterrupt):
            e = errors.Interrupted("interrupted; run the same command again to continue")
        _fail(e)
        return
    if pushgateway:
        _push(summary.output, pushgateway)
    _print_summary(summary.to_json())


def _push(run_dir: str, url: str) -> None:
    """A failed push is logged, not fatal: the results and metrics.prom are already written."""
    try:
        from jobrunner.telemetry.prom import push_metrics

        push_metrics(run_dir, url)
    except Exception as e:
        log.warning("could not push metrics to %s: %s", url, e)


@app.command()
def estimate(
    job: JobArg,
    set_: SetOpt = None,
    calibrate: Annotated[
        int,
        typer.Option(
            help="generate N sampled rows with the real model to measure lengths and speed", min=0
        ),
    ] = 0,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
) -> None:
    """Predict rows, tokens, time and cost before running (no weights unless --calibrate)."""
    _setup_logging(verbose)
    try:
        from jobrunner.config import load_job
        from jobrunner.estimate import estimate_job, save_estimate, to_text

        cfg = load_job(job, list(set_ or []))
        est = estimate_job(cfg, calibrate)
        path = save_estimate(cfg, est)
    except Exception as e:
        _fail(e)
        return
    typer.echo(to_text(est), err=True)
    _print_summary(
        {
            "status": "ok",
            "estimate": str(path),
            **{
                k: est[k]
                for k in ("rows", "prompt_tokens", "completion_tokens", "wall_seconds", "cost_usd")
            },
        }
    )


@app.command()
def validate(
    job: JobArg,
    set_: SetOpt = None,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
) -> None:
    """Check the job and its input (schema, prompts, token counts) without loading weights."""
    _setup_logging(verbose)
    try:
        from jobrunner.config import load_job
        from jobrunner.validate import validate_job

        cfg = load_job(job, list(set_ or []))
        summary = validate_job(cfg)
    except Exception as e:
        _fail(e)
        return
    _print_summary(summary)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="the run directory (output.path)")],
) -> None:
    """Rebuild every report from a run directory, without a model or a GPU."""
    _setup_logging(False)
    try:
        from jobrunner.io.rundir import RunDir
        from jobrunner.telemetry.report import write_reports

        rundir = RunDir(run_dir)
        if rundir.load_manifest() is None:
            raise errors.JobError(
                f"{run_dir}: no manifest.json; is this a jobrunner run directory?"
            )
        rep = write_reports(rundir)
    except Exception as e:
        _fail(e)
        return
    typer.echo((run_dir / "report.md").read_text(), err=True)
    _print_summary(
        {
            "status": "ok",
            "output": str(run_dir),
            "rows": rep["rows"],
            "cost_usd": rep["cost"]["cost_usd"],
        }
    )


@app.command("quantize-check")
def quantize_check(
    job: JobArg,
    set_: SetOpt = None,
    sample: Annotated[
        int, typer.Option("--sample", min=1, help="prompts sampled from the input")
    ] = 8,
    quantization: Annotated[
        str | None,
        typer.Option(help="int8 | int4 | fp8 (default: the job's model.quantization, else int8)"),
    ] = None,
    write: Annotated[
        Path | None,
        typer.Option(
            help="write the job with the plan as model.keep_in_16bit to this path (may be the"
            " job file itself; YAML comments are not kept)"
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
) -> None:
    """Measure each linear layer's quantization error on sampled prompts; propose 16-bit layers."""
    _setup_logging(verbose)
    try:
        from jobrunner.config import load_job
        from jobrunner.quant_check import run_check

        cfg = load_job(job, list(set_ or []))
        summary = run_check(cfg, sample, quantization, write)
    except Exception as e:
        _fail(e)
        return
    _print_summary(summary)


def main() -> None:
    try:
        code = app(standalone_mode=False)  # click returns typer.Exit's code here, not raises it
        sys.exit(code if isinstance(code, int) else 0)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.BadParameter, typer.Abort) as e:  # pragma: no cover - click usage errors
        typer.echo(str(e), err=True)
        sys.exit(errors.EXIT_USAGE)
    except Exception as e:  # click usage errors (missing args, unknown options)
        if isinstance(e, typer.TyperException) and hasattr(e, "show"):  # typer's own click
            e.show()
            sys.exit(errors.EXIT_USAGE)
        raise
