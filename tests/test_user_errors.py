"""User errors are never "internal errors" (issue 21, class 6).

Exit 70 is a bug in jobrunner and nothing else: a path we may not write, a file where a
directory should be, a refused job setting or a full disk exit 78 or 75 with the path and the
fix; the stdout summary carries the whole message.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from crashkit import CLI, env, run_as_nobody
from typer.testing import CliRunner

from jobrunner import errors
from jobrunner.cli import app


def cli(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(app, list(args))
    lines = result.stdout.strip().splitlines()
    return result.exit_code, json.loads(lines[-1]) if lines else {}


def job_file(tmp_path: Path, recs: list[dict], **sections) -> Path:
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in recs))
    job = {"input": {"path": str(inp)}, "output": {"path": str(tmp_path / "out")}}
    for k, v in sections.items():
        job.setdefault(k, {}).update(v)
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job))
    return path


@pytest.mark.parametrize(
    "err, code, words",
    [
        (OSError(errno.ENOSPC, "No space left on device", "/data/out/x"), 75, "/data/out/x"),
        (OSError("[errno 28] error writing /data/out/part.parquet"), 75, "no space left"),
        (OSError(errno.EROFS, "Read-only file system", "/ro/out"), 78, "read-only file system"),
        (PermissionError(errno.EACCES, "Permission denied", "/root/x"), 78, "permission denied"),
    ],
)
def test_the_environments_os_errors_become_user_errors(err, code, words):
    user = errors.from_os_error(err)
    assert user is not None and user.exit_code == code and words in str(user)


def test_other_errors_stay_internal():
    assert errors.from_os_error(OSError(errno.ENOENT, "No such file", "/x")) is None
    assert errors.from_os_error(ValueError("bug")) is None


def test_report_on_a_directory_that_is_no_run_is_78_with_the_path(tmp_path):
    for where in (tmp_path, tmp_path / "missing"):
        code, summary = cli("report", str(where))
        assert code == 78 and str(where) in summary["error"]
        assert "is not a jobrunner run directory" in summary["error"]


def test_a_refused_template_field_is_a_configuration_error(tmp_path):
    job = job_file(tmp_path, [{"id": "a", "prompt": "x"}], input={"prompt": {"template": "{a.b}"}})
    code, summary = cli("run", str(job))
    assert code == 78
    # the job file first, then the key and what is wrong with it
    assert summary["error"].startswith(f"{job}: input.prompt.template: template field {{a.b}}")


def test_the_summary_holds_the_whole_message(tmp_path):
    recs = [{"id": f"r{i}", "prompt": "x"} for i in range(3)] * 2
    code, summary = cli("run", str(job_file(tmp_path, recs)))
    assert code == 65
    lines = summary["error"].splitlines()
    assert lines[0] == f"3 duplicate ids in the input at {tmp_path} (ids must be unique):"
    assert lines[1:] == [
        f"  id 'r{i}' at in.jsonl:line {i + 1}, in.jsonl:line {i + 4}" for i in range(3)
    ]


def test_an_internal_error_is_summarised_by_type_and_message(monkeypatch, tmp_path):
    import jobrunner.executors as executors

    def broken(cfg, opts):
        raise ValueError(b"\xff\xfe".decode("latin-1"))

    monkeypatch.setattr(executors, "run_with_executor", broken)
    code, summary = cli("run", str(job_file(tmp_path, [{"id": "a", "prompt": "x"}])))
    assert code == 70 and summary["error"] == "internal error: ValueError: \xff\xfe"


def test_an_unwritable_cache_falls_back_before_anything_is_computed(tmp_path, monkeypatch):
    import tempfile

    from jobrunner.engine import resolve

    monkeypatch.setenv("JOBRUNNER_CACHE", "/proc/jobrunner-cache")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert resolve.writable_cache_dir() == tmp_path / f"jobrunner-cache-{os.getuid()}"
    monkeypatch.setattr(tempfile, "tempdir", "/proc")
    with pytest.raises(errors.ConfigError, match="set \\$JOBRUNNER_CACHE"):
        resolve.writable_cache_dir()


def test_a_dequantize_that_fails_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    from jobrunner.engine import loader
    from jobrunner.engine.resolve import ModelSource

    target = tmp_path / "gguf" / "abc-v2"
    stale = tmp_path / "gguf" / "abc-v2.tmp999999999"  # a process killed with -9
    stale.mkdir(parents=True)

    class Boom(Exception):
        pass

    def fail(*a, **k):
        raise Boom

    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(Boom):
        loader._dequantize_gguf(ModelSource("gguf", str(tmp_path), "m", "m.gguf"), target)
    assert list((tmp_path / "gguf").iterdir()) == []


def test_a_fault_in_our_own_conversion_is_not_blamed_on_the_model_files(tmp_path, monkeypatch):
    """model.source errors are for what transformers refuses in the user's files; a ValueError
    of our own writing code (after transformers read the file) stays a bug (exit 70)."""
    from jobrunner.config import ModelConfig
    from jobrunner.engine import loader

    class Saves:
        def save_pretrained(self, path):
            pass

    class Loaded:
        config = generation_config = Saves()

    import transformers

    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Loaded()
    )
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: object())
    monkeypatch.setattr(
        loader, "_save_weights", lambda *a: (_ for _ in ()).throw(ValueError("ours"))
    )
    monkeypatch.setenv("JOBRUNNER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="ours") as caught:
        loader.load_model(ModelConfig(source=str(tmp_path / "m.gguf")))
    assert not isinstance(caught.value, errors.JobError)


def test_an_output_directory_we_may_not_write_is_78_with_the_path(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)
    job = job_file(tmp_path, [{"id": "a", "prompt": "x"}])
    data = json.loads(job.read_text())
    data["output"]["path"] = str(locked / "out")
    job.write_text(json.dumps(data))
    for f in (job, tmp_path / "in.jsonl"):
        f.chmod(0o644)
    p = run_as_nobody(["run", str(job)], tmp_path)
    assert p.returncode == 78, p.stderr[-2000:]
    err = json.loads(p.stdout.strip().splitlines()[-1])["error"]
    assert str(locked / "out") in err and "permission denied" in err


# ------------------------------------------------------ issue: user errors that exited 70


@pytest.mark.parametrize("source", ["nosuchorg/nosuchmodel", "foo bar/baz", "${HOME}/x"])
@pytest.mark.parametrize("command", ["validate", "estimate"])
def test_a_model_source_that_cannot_load_is_78_naming_it(tmp_path, source, command):
    """A hub id that is not in the cache, or that the hub would refuse: the same 78 as `run`."""
    job = job_file(tmp_path, [{"id": "a", "prompt": "x"}])
    code, summary = cli(command, str(job), "--set", f"model.source={source}")
    assert code == 78, summary
    assert summary["error"].startswith("model.source: ") and source in summary["error"]


def broken_model(tmp_path: Path, kind: str) -> Path:
    """The user's model files, damaged: a .gguf of junk, config.json that is no JSON, a folder
    with a config and no tokenizer."""
    if kind == "gguf":
        (tmp_path / "bad.gguf").write_text("junk")
        return tmp_path / "bad.gguf"
    folder = tmp_path / kind
    folder.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}
    (folder / "config.json").write_text("{not json" if kind == "badjson" else json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "kind, words",
    [
        ("gguf", "GGUF magic bytes"),
        ("badjson", "not a valid JSON file"),
        ("notokenizer", "tokenizer"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "estimate", "run"])
def test_broken_model_files_are_78_naming_the_path(tmp_path, monkeypatch, kind, words, command):
    monkeypatch.setenv("JOBRUNNER_CACHE", str(tmp_path / "cache"))
    model = broken_model(tmp_path, kind)
    job = job_file(tmp_path, [{"id": "a", "prompt": "x"}], model={"source": str(model)})
    code, summary = cli(command, str(job))
    assert code == 78, summary
    assert summary["error"].startswith(f"model.source: cannot load {model}")
    if command != "run" or kind != "notokenizer":  # run meets the missing weights first
        assert words in summary["error"]


@pytest.mark.parametrize(
    "code, expected, words",
    [
        (errno.EFBIG, 75, "ulimit -f"),
        (errno.EMFILE, 75, "ulimit -n"),
        (errno.ENFILE, 75, "too many open files"),
        (errno.EIO, 75, "input/output error"),
        (errno.ENAMETOOLONG, 78, "too long"),
        (errno.EISDIR, 78, "is a directory"),
        (errno.ENOTDIR, 78, "is a file where a folder is expected"),
        (errno.ELOOP, 78, "symbolic links"),
    ],
)
def test_every_errno_an_environment_throws_at_a_write_is_mapped(code, expected, words):
    user = errors.from_os_error(OSError(code, os.strerror(code), "/data/out/report.html"))
    assert user is not None and user.exit_code == expected
    assert words in str(user) and "/data/out/report.html" in str(user)


@pytest.mark.slow
def test_a_file_size_limit_is_75_naming_the_file(tmp_path):
    """`ulimit -f`: a write past it fails with EFBIG; like a full disk, rerun once it is lifted."""
    import resource

    job = job_file(tmp_path, [{"id": "a", "prompt": "x"}], model={"dtype": "float32"})

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    p = subprocess.run(
        [*CLI, "estimate", str(job)], capture_output=True, text=True, env=env(), preexec_fn=limit
    )
    assert p.returncode == 75, p.stderr[-2000:]
    err = json.loads(p.stdout.strip().splitlines()[-1])["error"]
    assert str(tmp_path / "out" / "estimate.json") in err and "ulimit -f" in err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("finished")
    job = job_file(
        tmp,
        [{"id": "a", "prompt": "hi"}, {"id": "b", "prompt": "yo"}],
        model={"dtype": "float32"},
        generation={"max_new_tokens": 2},
    )
    code, summary = cli("run", str(job))
    assert code == 0, summary
    return tmp / "out"


@pytest.mark.slow
@pytest.mark.parametrize(
    "damaged", ["results/part-00000.parquet", "telemetry/steps.parquet", "telemetry/rows.parquet"]
)
def test_report_on_a_damaged_file_is_78_naming_it(finished_run, tmp_path, damaged):
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    (out / damaged).write_text("garbage\n")
    code, summary = cli("report", str(out))
    assert code == 78, summary
    assert summary["error"].startswith(f"{out / damaged} does not read")
    assert "damaged" in summary["error"] and "Move it out of" in summary["error"]


@pytest.mark.parametrize(
    "where, words",
    [
        ("somedir", "is a directory"),
        ("/proc/x.yaml", "cannot write in /proc"),
        ("missing/dir/x.yaml", "does not exist; create it first"),
        ("data.csv/x.yaml", "is a file, not a folder"),
    ],
)
def test_init_refuses_a_path_it_cannot_write_with_78(tmp_path, monkeypatch, where, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "somedir").mkdir()
    (tmp_path / "data.csv").write_text("id,text\n1,hello\n")
    code, summary = cli("init", "data.csv", "-o", where, "--force")
    assert code == 78, summary
    assert summary["error"].startswith(f"-o {where}: ") and words in summary["error"]
    assert not (tmp_path / "missing").exists()  # a mistyped folder is never created


def test_quantize_check_refuses_a_write_path_before_any_model_loads(tmp_path):
    job = job_file(tmp_path, [{"id": "a", "prompt": "x"}], model={"source": "nosuch/model"})
    code, summary = cli("quantize-check", str(job), "--sample", "1", "--write", "/proc/x.yaml")
    assert code == 78, summary
    assert summary["error"].startswith("--write /proc/x.yaml: cannot write in /proc")


def billion_laughs() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join([*lines, "name: *a8"]) + "\n"


def test_a_billion_laughs_job_file_is_78_in_bounded_memory(tmp_path):
    """1 KB whose aliases expand to 387M values: refused before anything expands them. The
    address-space limit turns the old unbounded walk into a MemoryError, not a machine's swap."""
    import resource

    job = tmp_path / "job.yaml"
    job.write_text(billion_laughs())

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    p = subprocess.run(
        [*CLI, "validate", str(job)], capture_output=True, text=True, env=env(), preexec_fn=limit
    )
    assert p.returncode == 78, p.stderr[-2000:]
    err = json.loads(p.stdout.strip().splitlines()[-1])["error"]
    assert err == (
        f"{job}: its aliases (*name) expand to more than 100,000 values; write the values out,"
        " or use fewer aliases"
    )


@pytest.mark.parametrize(
    "text, words",
    [
        ("a: &a [1, *a]\n", "1: an alias here refers to a value that holds it"),
        ("name: " + "[" * 5000 + "]" * 5000 + "\n", ": values nested too deeply to read"),
    ],
)
def test_a_self_holding_or_deep_yaml_job_file_is_78(tmp_path, text, words):
    job = tmp_path / "job.yaml"
    job.write_text(text)
    code, summary = cli("validate", str(job))
    assert code == 78, summary
    assert summary["error"].startswith(str(job)) and words in summary["error"]


def test_validate_takes_a_corrected_job_where_run_stopped_before_any_row(tmp_path):
    """`run` stopped by a bad model leaves a run directory with no row, which the corrected job
    takes (DESIGN promise 3): `validate` says so too, instead of refusing a different job."""
    job = job_file(tmp_path, [{"id": "a", "prompt": "x"}], model={"source": "nosuch/model"})
    assert cli("run", str(job))[0] == 78
    assert (tmp_path / "out" / "manifest.json").is_file()
    code, summary = cli("validate", str(job), "--set", "model.source=smollm2-135m-instruct")
    assert code == 0, summary


@pytest.mark.parametrize(
    "generation, words",
    [
        (
            {"logit_bias": {"49152": -100, "7": 5}},
            "generation.logit_bias: token id 49152 past the model's vocabulary of 49152 tokens"
            " (ids 0 to 49151); use ids of this model's tokenizer",
        ),
        (
            {"stop_token_ids": [2, 70000, 50000]},
            "generation.stop_token_ids: token ids 70000, 50000 past the model's vocabulary",
        ),
    ],
)
@pytest.mark.parametrize("command", ["validate", "run"])
def test_job_token_ids_past_the_vocabulary_exit_78_before_any_row(
    tmp_path, monkeypatch, command, generation, words
):
    """Not a bad_sampling error on every row (exit 65): the job's own ids, refused once the
    tokenizer is loaded (run: before the quality gate, quantizing and the engine)."""
    from jobrunner.engine import start

    monkeypatch.setattr(start, "prepare_weights", lambda *a: pytest.fail("went on past the load"))
    job = job_file(tmp_path, [{"id": "a", "prompt": "hi"}], generation=generation)
    code, summary = cli(command, str(job))
    assert (code, summary["exit_code"]) == (78, 78)
    assert summary["error"].startswith(f"{job}: {words}")  # the job file, then the key
    assert not (tmp_path / "out" / "errors.jsonl").exists()
    assert not list((tmp_path / "out").glob("results/*"))
