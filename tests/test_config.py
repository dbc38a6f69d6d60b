"""Job-file loading: typed values, errors naming file, line and key path, overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobrunner.config import load_job
from jobrunner.errors import EXIT_CONFIG, ConfigError
from tests.conftest import write_job

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_and_values(tmp_path):
    cfg = load_job(write_job(tmp_path / "job.yaml", "name: x\ngeneration:\n  max_new_tokens: 7\n"))
    assert cfg.name == "x"
    assert cfg.generation.max_new_tokens == 7
    assert cfg.engine.kind == "paged"
    assert cfg.input.prompt.column == "prompt"
    assert cfg.engine.max_batch_tokens is None  # per device: 4096 tokens a step on a CPU
    assert cfg.engine.batch_tokens("cpu") == 4096 and cfg.engine.batch_tokens("cuda") == 8192


def test_a_given_step_budget_holds_on_every_device(tmp_path):
    cfg = load_job(write_job(tmp_path / "job.yaml", "name: x\nengine: {max_batch_tokens: 999}\n"))
    assert cfg.engine.batch_tokens("cpu") == cfg.engine.batch_tokens("cuda") == 999


def test_bad_value_names_file_line_and_key(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: x\n\n\n\n\ngeneration:\n  temperature: -1\n")
    with pytest.raises(ConfigError) as e:
        load_job(job)
    assert str(e.value) == f"{job}:7 generation.temperature: must be >= 0.0, got -1"
    assert e.value.exit_code == EXIT_CONFIG


@pytest.mark.parametrize(
    "value, why",
    [
        ("temperature: .inf", "2 generation.temperature: Input should be a finite number"),
        ("repetition_penalty: .nan", "2 generation.repetition_penalty: Input should be a finite"),
        ('stop: ["", "END"]', "2 generation.stop.0: String should have at least 1 character"),
        ("stop_token_ids: [2, -5]", "2 generation.stop_token_ids.1: must be >= 0, got -5"),
        ('\nname: "two\\nlines"', "3 name: .*must be one line of text"),
    ],
)
def test_sampling_values_no_row_could_use_are_refused(tmp_path, value, why):
    job = write_job(tmp_path / "job.yaml", f"generation:\n  {value}\n")
    with pytest.raises(ConfigError, match=why):
        load_job(job)


@pytest.mark.parametrize(
    "value, why",
    [
        ("max_new_tokens: true", "generation.max_new_tokens: must be an integer, got true"),
        (
            'max_new_tokens: "128"',
            "generation.max_new_tokens: must be an integer, got '128'"
            " (quoted, so YAML reads it as text: remove the quotes)",
        ),
        ("max_new_tokens: 2.0", "generation.max_new_tokens: must be an integer, got 2.0 (write"),
        ("seed: 1.5", "generation.seed: must be an integer, got 1.5"),
        ("top_k: false", "generation.top_k: must be an integer, got false"),
        ('ignore_eos: "yes"', "generation.ignore_eos: must be true or false, got 'yes' (quoted"),
        ("ignore_eos: 1", "generation.ignore_eos: must be true or false, got 1"),
        ("logprobs: 0", "generation.logprobs: must be true or false, got 0"),
        ('temperature: "0.5"', "generation.temperature: must be a number, got '0.5' (quoted"),
        ("top_p: true", "generation.top_p: must be a number, got true"),
        ("stop: [1]", "generation.stop.0: must be text, got 1 (quote it for text)"),
        ("choice: [yes, no]", "generation.choice.0: must be text, got true (YAML reads unquoted"),
        ("stop_token_ids: [2.0]", "generation.stop_token_ids.0: must be an integer, got 2.0"),
        ("logit_bias: {7: true}", "generation.logit_bias.7: must be a number, got true"),
        ("logit_bias: {x: 1}", "generation.logit_bias: each key must be an integer, got 'x'"),
    ],
)
def test_a_value_of_the_wrong_yaml_type_is_refused_not_coerced(tmp_path, value, why):
    job = write_job(tmp_path / "job.yaml", f"name: x\ngeneration:\n  {value}\n")
    with pytest.raises(ConfigError) as e:
        load_job(job)
    assert str(e.value).startswith(f"{job}:3 {why}")
    assert e.value.exit_code == EXIT_CONFIG


@pytest.mark.parametrize(
    "text, why",
    [
        ("name: 5", "1 name: must be text, got 5 (quote it for text)"),
        ("model: {trust_remote_code: 1}", "1 model.trust_remote_code: must be true or false"),
        ("model: {keep_in_16bit: lm_head}", "1 model.keep_in_16bit: must be a list, got 'lm_he"),
        ("input: {batch_rows: 1.0e+3}", "1 input.batch_rows: must be an integer, got 1000.0"),
        ("input: {use_chat_template: 'no'}", "1 input.use_chat_template: must be true or false"),
        ("input: {prompt: text}", "1 input.prompt: must be a mapping of keys, got 'text'"),
        ("output: {keep_input_columns: 0}", "1 output.keep_input_columns: must be true or false"),
        ("output: {shard_rows: '10'}", "1 output.shard_rows: must be an integer, got '10'"),
        ("engine: {kv_cache_bytes: 8.0e+9}", "1 engine.kv_cache_bytes: must be an integer, got"),
        ("engine: {prefix_caching: 'false'}", "1 engine.prefix_caching: must be true or false"),
        ("embedding: {normalize: 1}", "1 embedding.normalize: must be true or false, got 1"),
        ("cost: {gpu_hour_usd: '2.5'}", "1 cost.gpu_hour_usd: must be a number, got '2.5'"),
        ("ray: {num_workers: true}", "1 ray.num_workers: must be an integer, got true"),
        ("model: 5", "1 model: must be a mapping of keys, got 5"),
    ],
)
def test_every_section_refuses_a_value_of_the_wrong_type(tmp_path, text, why):
    job = write_job(tmp_path / "job.yaml", text + "\n")
    with pytest.raises(ConfigError) as e:
        load_job(job)
    assert str(e.value).startswith(f"{job}:{why}")


def test_numbers_where_a_number_is_wanted_still_load(tmp_path):
    job = write_job(
        tmp_path / "job.yaml",
        "generation:\n  temperature: 1\n  top_p: 1\n  logit_bias: {'50256': -100, 7: 2}\n"
        "ray: {cpus_per_worker: 2}\noutput: {shard_seconds: 5}\n",
    )
    cfg = load_job(job)
    assert cfg.generation.temperature == 1.0 and isinstance(cfg.generation.temperature, float)
    assert cfg.generation.logit_bias == {50256: -100.0, 7: 2.0}  # OpenAI's bodies key it by text
    assert (cfg.ray.cpus_per_worker, cfg.output.shard_seconds) == (2.0, 5.0)


def test_set_values_are_typed_as_yaml_reads_them(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: x\n")
    cfg = load_job(job, ["generation.max_new_tokens=64", "model.revision='2024'", 'name="5"'])
    assert (cfg.generation.max_new_tokens, cfg.model.revision, cfg.name) == (64, "2024", "5")
    with pytest.raises(ConfigError) as e:
        load_job(job, ["model.revision=2024"])
    assert str(e.value) == (
        "--set model.revision=2024: model.revision must be text, got 2024 (the value was read"
        " as YAML; quote it for text: --set 'model.revision=\"2024\"')"
    )
    with pytest.raises(ConfigError, match=r"^--set generation.ignore_eos=1: generation.ignore_"):
        load_job(job, ["generation.ignore_eos=1"])
    with pytest.raises(ConfigError, match=r"^--set generation.stop=\[1\]: generation.stop.0 must"):
        load_job(job, ["generation.stop=[1]"])


def test_unknown_key_is_refused_with_its_line(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: x\nmodel:\n  source: a/b\n  dtyp: float32\n")
    with pytest.raises(ConfigError, match=r"job.yaml:4 model.dtyp: unknown key"):
        load_job(job)


@pytest.mark.parametrize("key", ["source_file: /etc/x.yaml", "paths_base: {input.path: x}"])
def test_fields_load_job_fills_in_are_no_job_file_keys(tmp_path, key):
    job = write_job(tmp_path / "job.yaml", f"name: x\n{key}\n")
    with pytest.raises(ConfigError, match=rf"job.yaml:2 {key.split(':')[0]}: unknown key"):
        load_job(job)


def test_literal_lists_the_allowed_values(tmp_path):
    job = write_job(tmp_path / "job.yaml", "engine:\n  kind: turbo\n")
    with pytest.raises(
        ConfigError,
        match=r"job.yaml:2 engine.kind: must be one of 'auto', 'paged' or 'static', got 'turbo'",
    ):
        load_job(job)


def test_prompt_needs_exactly_one_source(tmp_path):
    job = write_job(tmp_path / "job.yaml", "input:\n  prompt: {column: a, template: 'x {a}'}\n")
    with pytest.raises(ConfigError, match=r"job.yaml:2 input.prompt: give exactly one of"):
        load_job(job)


def test_overrides_parse_yaml_values(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: x\n")
    cfg = load_job(
        job,
        [
            "generation.max_new_tokens=64",
            "generation.stop=[a, b]",
            "engine.prefix_caching=false",
            "input.system_prompt=null",
        ],
    )
    assert cfg.generation.max_new_tokens == 64
    assert cfg.generation.stop == ["a", "b"]
    assert cfg.engine.prefix_caching is False
    assert cfg.input.system_prompt is None


def test_bad_override_is_a_config_error(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: x\n")
    with pytest.raises(ConfigError, match="generation.max_new_tokens"):
        load_job(job, ["generation.max_new_tokens=0"])
    with pytest.raises(ConfigError, match="expected key.path=value"):
        load_job(job, ["generation.max_new_tokens"])


def test_invalid_yaml_names_the_line(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: x\nmodel: [\n")
    with pytest.raises(ConfigError, match=r"job.yaml:\d+: not valid YAML"):
        load_job(job)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the job file"):
        load_job(tmp_path / "nope.yaml")


def test_unknown_key_proposes_the_nearest_and_points_to_the_docs(tmp_path):
    job = write_job(tmp_path / "job.yaml", "generation:\n  max_new_token: 8\n")
    with pytest.raises(ConfigError) as e:
        load_job(job)
    assert str(e.value).startswith(
        f"{job}:2 generation.max_new_token: unknown key; did you mean generation.max_new_tokens?"
    )
    assert "docs/DESIGN.md" in str(e.value)


def test_unknown_key_in_the_wrong_section_proposes_its_home(tmp_path):
    job = write_job(tmp_path / "job.yaml", "model:\n  temperature: 0.5\n")
    with pytest.raises(ConfigError, match="did you mean generation.temperature"):
        load_job(job)


def test_bad_set_value_is_blamed_on_the_argument(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: x\ngeneration:\n  temperature: 0.5\n")
    with pytest.raises(ConfigError) as e:
        load_job(job, ["generation.temperature=-1"])
    assert str(e.value) == (
        "--set generation.temperature=-1: generation.temperature must be >= 0.0, got -1"
    )
    with pytest.raises(ConfigError, match=r"quote it for text: --set 'name=\"\{x\}\"'"):
        load_job(job, ["name={x}"])  # YAML reads {x} as a mapping


def test_unknown_executor_is_a_config_error(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: x\n")
    with pytest.raises(ConfigError) as e:
        load_job(job, executor="foo")
    assert str(e.value) == "--executor foo: executor must be one of 'local' or 'ray', got 'foo'"


def test_relative_paths_resolve_against_the_job_files_folder(tmp_path, monkeypatch):
    (tmp_path / "jobs").mkdir()
    job = write_job(
        tmp_path / "jobs" / "job.yaml",
        "input: {path: ../data/rows.csv}\noutput: {path: out/x}\nmodel: {source: ./m.gguf}\n",
    )
    monkeypatch.chdir("/")
    cfg = load_job(job)
    assert cfg.input.path == str(tmp_path / "data" / "rows.csv")
    assert cfg.output.path == str(tmp_path / "jobs" / "out" / "x")
    assert cfg.model.source == str(tmp_path / "jobs" / "m.gguf")


def test_set_paths_resolve_against_the_working_directory(tmp_path, monkeypatch):
    job = write_job(tmp_path / "job.yaml", "output: {path: out/x}\n")
    monkeypatch.chdir(tmp_path.parent)
    cfg = load_job(job, ["input.path=rows.parquet"])
    assert cfg.input.path == str(tmp_path.parent / "rows.parquet")
    assert "working directory" in cfg.paths_base["input.path"]


def test_absolute_paths_urls_and_model_names_are_kept(tmp_path):
    job = write_job(
        tmp_path / "job.yaml",
        "input: {path: /data/rows.parquet}\noutput: {path: s3://bucket/out}\n"
        "model: {source: HuggingFaceTB/SmolLM2-135M-Instruct}\n",
    )
    cfg = load_job(job)
    assert cfg.input.path == "/data/rows.parquet"
    assert cfg.output.path == "s3://bucket/out"
    assert cfg.model.source == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_relocated_job_keeps_naming_the_same_files(tmp_path):
    import yaml

    from jobrunner.config import relocate_paths

    (tmp_path / "jobs").mkdir()
    job = write_job(tmp_path / "jobs" / "job.yaml", "input: {path: ../data/a.csv}\n")
    data = yaml.safe_load(job.read_text())
    target = tmp_path / "elsewhere" / "deep" / "job.yaml"
    relocate_paths(data, job, target)
    assert data["input"]["path"] == "../../data/a.csv"
    target.parent.mkdir(parents=True)
    target.write_text(yaml.safe_dump(data))
    assert load_job(target).input.path == str(tmp_path / "data" / "a.csv")


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    job = write_job(tmp_path / "job.yaml", "name: a\ngeneration:\n  seed: 1\n  seed: 2\n")
    with pytest.raises(ConfigError, match=r"job.yaml:4 generation.seed: this key is given twice"):
        load_job(job)
    merged = "generation:\n  <<: {seed: 1}\n  seed: 2\n"  # a YAML merge key may be overridden
    assert load_job(write_job(tmp_path / "m.yaml", merged)).generation.seed == 2


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "jobs").glob("*.yaml")))
def test_every_shipped_job_file_loads(name):
    """The job files the README points to load as they are (the models are strict: an example
    written with a value of the wrong type would be refused)."""
    cfg = load_job(ROOT / "jobs" / name)
    assert cfg.source_file == str(ROOT / "jobs" / name)
