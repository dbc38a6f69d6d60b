"""The command line: run, validate, estimate, report, quantize-check, init. No logic here;
errors become exit codes.

Logs and human summaries go to stderr; the last line on stdout is a one-line JSON summary (for
Airflow's XCom).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from jobrunner import collector, errors
from jobrunner.io.store_errors import from_store_error


class _Command(TyperCommand):
    """Plain help text: arguments by name, options with a metavar only where they take a value."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        args = [p for p in self.get_params(ctx) if p.param_type_name == "argument"]
        return ["[OPTIONS]", *(_arg_name(p) if p.required else f"[{_arg_name(p)}]" for p in args)]

    def format_options(self, ctx, formatter) -> None:
        params = self.get_params(ctx)
        args = [(_arg_name(p), p.help or "") for p in params if p.param_type_name == "argument"]
        opts = [
            rv for p in params if p.param_type_name == "option" and (rv := p.get_help_record(ctx))
        ]
        for title, rows in (("Arguments", args), ("Options", opts)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _arg_name(param) -> str:
    return param.metavar or param.name.upper()


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    cls=TyperGroup,
    help="Offline batch LLM inference: a job file in, completions and a cost report out."
    " Start with `jobrunner init DATA_FILE`, then `jobrunner run JOB_FILE`.",
)
log = logging.getLogger("jobrunner")

JobArg = Annotated[Path, typer.Argument(help="the job file (YAML)", metavar="JOB_FILE")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="override a job key, e.g. generation.max_new_tokens=64 (repeatable; relative"
        " paths resolve against the working directory)",
    ),
]
VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="debug logs")]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"jobrunner {version('jobrunner')}")
        except PackageNotFoundError:  # run from a source tree that is not installed
            typer.echo("jobrunner (not installed)")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Offline batch LLM inference: a job file in, completions and a cost report out."""


def _load(job: Path, set_: list[str] | None, executor: str | None = None):
    """The job, loaded and checked against its input's formats and columns and its structured
    output compiled (before any row or model)."""
    from jobrunner.config import load_job
    from jobrunner.formats import check_read_options
    from jobrunner.prep.columns import check_columns
    from jobrunner.structured.check import check_job_spec

    cfg = load_job(job, list(set_ or []), executor=executor)
    check_columns(cfg)
    check_read_options(cfg)
    check_job_spec(cfg)
    return cfg


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("transformers", "httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # the Azure SDK logs every HTTP request and response, headers included, at INFO
    logging.getLogger("azure").setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")


def _fail(e: BaseException) -> None:
    """A JobError (or an OSError the environment caused) exits with its code and message;
    anything else is a bug in jobrunner: exit 70 with the traceback on stderr."""
    user = e if isinstance(e, errors.JobError) else from_store_error(e) or errors.from_os_error(e)
    if user is not None:
        typer.echo(f"error: {user}", err=True)
        _print_summary({"status": "error", "exit_code": user.exit_code, "error": str(user)})
        raise typer.Exit(user.exit_code)
    log.exception("internal error")
    message = f"internal error: {type(e).__name__}: {e}"
    _print_summary({"status": "error", "exit_code": errors.EXIT_INTERNAL, "error": message})
    raise typer.Exit(errors.EXIT_INTERNAL)


def _print_summary(summary: dict) -> None:
    sys.stdout.write(json.dumps(summary, default=str) + "\n")
    sys.stdout.flush()


@app.command(cls=_Command, short_help="run a job (resumes where an earlier run stopped)")
def run(
    job: JobArg,
    set_: SetOpt = None,
    restart: Annotated[
        bool, typer.Option("--restart", help="discard earlier results in output.path")
    ] = False,
    retry_errors: Annotated[
        bool, typer.Option("--retry-errors", help="rerun only the rows that failed")
    ] = False,
    executor: Annotated[
        str | None, typer.Option(metavar="NAME", help="local or ray (default: the job's)")
    ] = None,
    pushgateway: Annotated[
        str | None,
        typer.Option(
            metavar="URL", help="push the job's metrics to this Prometheus Pushgateway at the end"
        ),
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run a job: every input row gets a completion; resumes where an earlier run stopped."""
    if restart and retry_errors:  # one discards every result, the other keeps all but failed
        raise typer.BadParameter(
            "--restart discards every earlier result and --retry-errors keeps all but the"
            " failed rows: give one of them",
            param_hint="'--restart' / '--retry-errors'",
        )
    _setup_logging(verbose)
    collector.pause()  # the start-up's imports make little garbage; on again once it is done
    try:
        from jobrunner.executors import run_with_executor
        from jobrunner.pipeline import RunOptions

        cfg = _load(job, set_, executor)
        summary = run_with_executor(cfg, RunOptions(restart=restart, retry_errors=retry_errors))
    except (Exception, KeyboardInterrupt) as e:
        if isinstance(e, KeyboardInterrupt):
            e = errors.Interrupted("interrupted; run the same command again to continue")
        _fail(e)
        return
    finally:
        collector.resume()
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


@app.command(cls=_Command, short_help="predict tokens, time and cost before a run")
def estimate(
    job: JobArg,
    set_: SetOpt = None,
    calibrate: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=0,
            show_default=False,
            help="generate N sampled rows with the real model to measure lengths and speed",
        ),
    ] = 0,
    verbose: VerboseOpt = False,
) -> None:
    """Predict rows, tokens, time and cost before running (no weights unless --calibrate)."""
    _setup_logging(verbose)
    try:
        from jobrunner.estimate import estimate_job, save_estimate, to_text

        cfg = _load(job, set_)
        est = estimate_job(cfg, calibrate)
        typer.echo(to_text(est), err=True)  # shown even when it cannot be saved
        path, not_saved = save_estimate(cfg, est)
    except Exception as e:
        _fail(e)
        return
    if path is None:
        typer.echo(f"estimate.json not written: {not_saved}", err=True)
    _print_summary(
        {
            "status": "ok",
            "estimate": str(path) if path else None,
            **({"not_written": not_saved} if path is None else {}),
            **{
                k: est[k]
                for k in ("rows", "prompt_tokens", "completion_tokens", "wall_seconds", "cost_usd")
            },
        }
    )


@app.command(cls=_Command, short_help="check the job, every row and the output path")
def validate(
    job: JobArg,
    set_: SetOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Check the job, every input row (prompts, token counts) and the output path, without
    loading weights."""
    _setup_logging(verbose)
    try:
        from jobrunner.validate import to_text, validate_job

        summary = validate_job(_load(job, set_))
    except Exception as e:
        _fail(e)
        return
    typer.echo(to_text(summary), err=True)
    _print_summary(summary)


@app.command(cls=_Command, short_help="rebuild the reports of a run directory")
def report(
    run_dir: Annotated[
        str,
        typer.Argument(metavar="RUN_DIR", help="the run directory (output.path, or a store URL)"),
    ],
) -> None:
    """Rebuild every report from a run directory, without a model or a GPU (not while a run
    is in progress there: exit 75)."""
    _setup_logging(False)
    try:
        from jobrunner.io.store_rundir import open_rundir
        from jobrunner.lifecycle import rebuild_reports

        rundir = open_rundir(run_dir)
        rep = rebuild_reports(rundir)
    except Exception as e:
        _fail(e)
        return
    typer.echo((rundir.path / "report.md").read_text(), err=True)
    _print_summary(
        {
            "status": "ok",
            "output": str(run_dir),
            "rows": dataclasses.asdict(rep.rows),
            "cost_usd": rep.cost.cost_usd,
        }
    )


@app.command(
    "quantize-check", cls=_Command, short_help="per-layer quantization error; a 16-bit plan"
)
def quantize_check(
    job: JobArg,
    set_: SetOpt = None,
    sample: Annotated[
        int,
        typer.Option(
            "--sample", metavar="N", min=1, help="prompts sampled from the input (default 8)"
        ),
    ] = 8,
    quantization: Annotated[
        str | None,
        typer.Option(
            metavar="MODE",
            help="int8, int4 or fp8 (default: the job's model.quantization, else int8)",
        ),
    ] = None,
    write: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="write the job with the plan as model.keep_in_16bit to this path (may be the"
            " job file itself; YAML comments are not kept)",
        ),
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Measure each linear layer's quantization error on sampled prompts; propose 16-bit layers."""
    _setup_logging(verbose)
    try:
        from jobrunner.quant_check import run_check

        cfg = _load(job, set_)
        summary = run_check(cfg, sample, quantization, write)
    except Exception as e:
        _fail(e)
        return
    _print_summary(summary)


@app.command(cls=_Command, short_help="write a commented job file for a data file")
def init(
    input_file: Annotated[
        str,
        typer.Argument(
            metavar="DATA_FILE",
            help=(
                "a .csv, .tsv, .parquet or .jsonl file of your rows (also .gz, .zst), or a"
                " folder of them (a path, or a store URL: s3://...)"
            ),
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            metavar="PATH",
            help="where to write the job file (default: DATA_FILE's name with .yaml, next to it)",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing job file")] = False,
) -> None:
    """Write a commented job file for a data file: its columns, a proposed prompt, the defaults.
    It runs as is: `jobrunner run` it, or edit the prompt first."""
    _setup_logging(False)
    try:
        from jobrunner.init import write_job_file

        path, summary = write_job_file(input_file, output, force)
    except Exception as e:
        _fail(e)
        return
    typer.echo(f"wrote {path}\n{summary}\nnext: jobrunner run {path}", err=True)
    _print_summary({"status": "ok", "job": str(path)})


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
