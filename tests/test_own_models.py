"""A user's own Hugging Face checkpoint (`model.source: path/to/dir`): tiny random models of the
common architectures, built here, run exactly as HF generate runs them (float32, greedy)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from tinykit import builtin_tokenizer, chat_prompts, tiny_model
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import JobConfig, ModelConfig
from jobrunner.engine.loader import load_model
from jobrunner.engine.paged import PagedEngine
from jobrunner.engine.static import StaticEngine
from jobrunner.types import Request, SamplingParams

TEXTS = ["Hello, how are you?", "Write a haiku about the sea.", "What is 2+2?", "Three colours"]
NEW = 20


def load(path) -> object:
    torch.set_num_threads(2)
    return load_model(ModelConfig(source=str(path), dtype="float32"))


def run(engine, prompts) -> list[list[int]]:
    reqs = [Request(f"r{i}", p, SamplingParams(max_new_tokens=NEW)) for i, p in enumerate(prompts)]
    got = {r.id: r.token_ids for r in engine.generate(reqs)}
    return [got[f"r{i}"] for i in range(len(prompts))]


def paged(loaded) -> PagedEngine:
    cfg = JobConfig()
    cfg.engine.kv_cache_bytes = 1 << 22
    return PagedEngine(loaded, cfg)


def hf_greedy(loaded, prompts, **settings) -> list[list[int]]:
    """HF generate one row at a time, stopping where the checkpoint's EOS ids say."""
    out = []
    for p in prompts:
        x = torch.tensor([p])
        y = loaded.model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, **settings
        )
        out.append(y[0, len(p) :].tolist())
    return out


def test_the_checkpoints_sampling_settings_never_reach_the_static_engine(tmp_path):
    """Published generation_config.json files ask for penalties and sampling (Qwen2.5:
    repetition_penalty 1.05, top_k 20). A job's greedy rows are greedy on every engine: the
    static engine ran HF generate with them filled in and gave other tokens than the paged one."""
    asks = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 1, "do_sample": True, "top_k": 20}
    loaded = load(tiny_model(tmp_path, generation=asks))
    prompts = chat_prompts(TEXTS)
    plain = {"do_sample": False, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
    want = hf_greedy(loaded, prompts, **plain)
    assert hf_greedy(loaded, prompts, do_sample=False) != want  # the settings change tokens
    assert run(StaticEngine(loaded, JobConfig()), prompts) == want
    assert run(paged(loaded), prompts) == want
    assert loaded.model.generation_config.repetition_penalty == 1.5  # the model is left as it was


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("llama"))


def copy_of(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "model"))


def run_job(tmp_path: Path, model: Path, command: str = "run", **generation) -> tuple[int, dict]:
    """`jobrunner run` (or `command`) on two chat rows with this model: the exit code and its
    summary."""
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": t}) + "\n" for i, t in enumerate(TEXTS[:2]))
    )
    job = {
        "model": {"source": str(model), "dtype": "float32", "max_model_len": 256},
        "input": {"path": "in.jsonl", "prompt": {"column": "prompt"}},
        "generation": {"max_new_tokens": NEW, **generation},
        "output": {"path": "out", "format": "jsonl"},
    }
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    result = CliRunner().invoke(app, [command, str(tmp_path / "job.yaml")])
    lines = result.stdout.strip().splitlines()
    return result.exit_code, json.loads(lines[-1]) if lines else {}


def test_a_safetensors_file_cut_short_is_78_naming_it(llama_dir, tmp_path):
    """A download or copy that stopped half way was a SafetensorError traceback (exit 70)."""
    model = copy_of(llama_dir, tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, summary = run_job(tmp_path, model)
    assert code == 78
    assert str(weights) in summary["error"] and "cut short" in summary["error"]


def test_weights_config_json_does_not_describe_are_78(llama_dir, tmp_path):
    """config.json from another model (or a vocab_size edited) was a RuntimeError (exit 70)."""
    model = copy_of(llama_dir, tmp_path)
    conf = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**conf, "vocab_size": 1000}))
    code, summary = run_job(tmp_path, model)
    assert code == 78
    assert str(model) in summary["error"] and "config.json" in summary["error"]


def test_a_generation_config_that_does_not_read_is_78_naming_it(llama_dir, tmp_path):
    """transformers passes over a generation_config.json it cannot read, and with it the EOS
    ids a Llama-3-style chat turn ends with: the job ran every row to max_new_tokens."""
    model = copy_of(llama_dir, tmp_path)
    (model / "generation_config.json").write_text('{"eos_token_id": [2, 7,}')
    code, summary = run_job(tmp_path, model)
    assert code == 78
    assert str(model / "generation_config.json") in summary["error"]


def test_a_folder_without_tokenizer_files_is_78_saying_so(llama_dir, tmp_path):
    model = copy_of(llama_dir, tmp_path)
    for f in model.glob("tokenizer*"):
        f.unlink()
    code, summary = run_job(tmp_path, model)
    assert code == 78
    assert f"{model} has no tokenizer file" in summary["error"]
    assert "tokenizer.json" in summary["error"]


@pytest.mark.parametrize("window, kind", [(4096, "paged"), (16, "static")])
def test_a_sliding_window_falls_back_only_where_rows_outgrow_it(tmp_path, window, kind):
    """Mistral v0.1 ships sliding_window 4096: in a 256-token context it never slides, and the
    paged engine runs it (it fell back to the static engine, 'sliding-window attention (4096 <
    max_model_len 1073741824)'). A window rows can outgrow falls back, naming the context."""
    from jobrunner.engine.engines import make_engine

    loaded = load(tiny_model(tmp_path, "mistral", {"sliding_window": window}))
    cfg = JobConfig()
    cfg.model.max_model_len = 256
    cfg.engine.kv_cache_bytes = 1 << 22
    engine = make_engine(loaded, cfg)
    assert engine.kind == kind
    if kind == "static":
        assert engine.stats.notes == [
            "fell back from paged to static: sliding-window attention (16 < max_model_len 256)"
        ]
    prompts = chat_prompts(TEXTS)
    assert run(engine, prompts) == hf_greedy(loaded, prompts, do_sample=False)


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_tokenizer_larger_than_the_embeddings_is_78(tmp_path, command):
    """Tokens added to a tokenizer without the embeddings resized: the first prompt holding
    one ended the run with torch's 'index out of range' (exit 70), and validate, which reads
    no weights, called the job valid."""
    model = tiny_model(tmp_path / "model", config={"vocab_size": 30000})
    code, summary = run_job(tmp_path, model, command=command)
    assert code == 78
    assert f"the tokenizer in {model} has 49152 tokens" in summary["error"]
    assert "embeddings 30000 rows" in summary["error"]


def test_a_base_model_without_eos_or_pad_runs_on_the_static_engine(tmp_path):
    """A GPT-2-style base model whose tokenizer and configs name no EOS and no pad token: the
    static engine padded with min() of no EOS ids (exit 70); its rows run to their length."""
    none = {"eos_token_id": None, "bos_token_id": None, "pad_token_id": None}
    model = tiny_model(tmp_path, "gpt2", config=none, generation=none)
    conf = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(
        json.dumps({**conf, "eos_token": None, "pad_token": None})
    )
    loaded = load(model)
    assert loaded.eos_token_ids == set() and loaded.tokenizer.pad_token_id is None
    prompts = chat_prompts(TEXTS)
    want = hf_greedy(loaded, prompts, do_sample=False)
    assert all(len(w) == NEW for w in want)
    assert run(StaticEngine(loaded, JobConfig()), prompts) == want


def test_the_static_engine_keeps_rows_within_a_learned_position_table(tmp_path):
    """GPT-2 has 1024 learned positions (32 here) and a job's max_model_len defaults to 2048:
    a row that outgrew the table ended the run with 'index out of range' (exit 70). Rows now
    end at the model's context as on the paged engine (`length`), each as HF generates it
    alone, and a prompt that fills the context is that row's error."""
    loaded = load(tiny_model(tmp_path, "gpt2", config={"max_position_embeddings": 32}))
    prompts = [builtin_tokenizer()(t)["input_ids"] for t in TEXTS]  # 3 to 8 tokens
    reqs = [Request(f"r{i}", p, SamplingParams(max_new_tokens=40)) for i, p in enumerate(prompts)]
    reqs.append(Request("long", list(range(100, 132)), SamplingParams(max_new_tokens=4)))
    got = {r.id: r for r in StaticEngine(loaded, JobConfig()).generate(reqs)}
    for i, p in enumerate(prompts):
        x = torch.tensor([p])
        want = loaded.model.generate(
            x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=32 - len(p)
        )[0, len(p) :].tolist()
        assert got[f"r{i}"].token_ids == want
        assert got[f"r{i}"].choices[0].finish_reason.value == "length"
    assert got["long"].error_code == "prompt_too_long"
    assert "the model's context, 32 tokens" in got["long"].error


@pytest.mark.parametrize("engine", [StaticEngine, PagedEngine])
def test_rows_end_at_every_eos_id_the_checkpoint_lists(tmp_path, engine):
    """Llama-3-Instruct ends a turn with <|eot_id|>, one of several EOS ids, not the
    tokenizer's eos_token. Listed in generation_config.json they end rows as in HF generate;
    listed in config.json only (a generation_config.json saved with sampling settings alone),
    they ended nothing and rows ran to max_new_tokens."""
    model = tiny_model(tmp_path / "probe")
    prompts = chat_prompts(TEXTS)
    plain = hf_greedy(load(model), prompts, do_sample=False)
    ends = [plain[0][3], plain[1][5]]  # two turn-ending ids of this model's own choosing
    assert ends[0] not in plain[0][:3] and ends[1] not in plain[1][:5]
    for where in ("generation_config.json", "config.json"):
        d = Path(shutil.copytree(model, tmp_path / where))
        conf = json.loads((d / where).read_text())
        (d / where).write_text(json.dumps({**conf, "eos_token_id": [2, *ends]}))
        if where == "config.json":
            (d / "generation_config.json").write_text('{"bos_token_id": 1, "temperature": 0.6}')
        loaded = load(d)
        got = run(paged(loaded) if engine is PagedEngine else engine(loaded, JobConfig()), prompts)
        assert got[0] == plain[0][:4] and got[1] == plain[1][:6], where
        assert got[2:] == plain[2:]


def test_a_quantized_checkpoint_whose_package_is_missing_is_78(llama_dir, tmp_path):
    """An AWQ/GPTQ/bitsandbytes checkpoint needs its package to load: transformers' ImportError
    ended the run as an internal error (exit 70); it is the environment the job asks for."""
    if importlib.util.find_spec("optimum") is not None:
        pytest.skip("optimum is installed here")
    model = copy_of(llama_dir, tmp_path)
    conf = json.loads((model / "config.json").read_text())
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}
    (model / "config.json").write_text(json.dumps({**conf, "quantization_config": gptq}))
    code, summary = run_job(tmp_path, model)
    assert code == 78
    assert summary["error"].startswith(f"model.source: cannot load {model}")
    assert "optimum" in summary["error"]


def test_a_checkpoint_without_its_lm_head_is_78(llama_dir, tmp_path):
    """A folder whose weights lack the LM head (a classifier's or reward model's, a shard
    left out) loaded with the head at random: exit 0 and noise in every row."""
    from safetensors.torch import load_file, save_file

    model = copy_of(llama_dir, tmp_path)
    weights = load_file(model / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    code, summary = run_job(tmp_path, model)
    assert code == 78
    assert f"{model} has no weights for lm_head.weight" in summary["error"]


def test_a_checkpoint_with_its_own_code_names_the_job_key_that_allows_it(llama_dir, tmp_path):
    """transformers asks for `trust_remote_code=True`, an argument a job file has no place for;
    a local folder missing that code was told to download from the hub."""
    model = copy_of(llama_dir, tmp_path)
    conf = json.loads((model / "config.json").read_text())
    code_map = {"AutoConfig": "configuration_my.MyConfig"}
    (model / "config.json").write_text(
        json.dumps({**conf, "model_type": "mine", "auto_map": code_map})
    )
    code, summary = run_job(tmp_path, model)
    assert code == 78 and "set model.trust_remote_code: true" in summary["error"]
    job = json.loads((tmp_path / "job.yaml").read_text())
    job["model"]["trust_remote_code"] = True
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")])
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert result.exit_code == 78 and "configuration_my.py" in error
    assert "hf download" not in error  # a local folder: nothing to download


def test_a_weights_link_to_a_missing_file_is_78(llama_dir, tmp_path):
    """A hub cache snapshot links its files to blobs; a blob removed leaves the link."""
    model = copy_of(llama_dir, tmp_path)
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").symlink_to(tmp_path / "blobs" / "gone")
    code, summary = run_job(tmp_path, model)
    assert code == 78 and str(model) in summary["error"]


@pytest.mark.parametrize(
    "content, why",
    [
        (b"abc", "shorter than a safetensors header"),
        (struct.pack("<Q", 5) + b"[1,2]", "its header is not a safetensors header"),
        (struct.pack("<Q", 2) + b"{}" + b"x" * 10, None),
    ],
)
def test_a_safetensors_header_is_read_before_the_load(tmp_path, content, why):
    from jobrunner.engine.checkpoint import check_safetensors
    from jobrunner.errors import ConfigError

    (tmp_path / "model.safetensors").write_bytes(content)
    if why is None:
        check_safetensors(str(tmp_path))
        return
    with pytest.raises(ConfigError, match=why) as caught:
        check_safetensors(str(tmp_path))
    assert str(tmp_path / "model.safetensors") in str(caught.value)


def test_a_missing_shard_is_named_without_the_pickle_hint(tmp_path):
    """A sharded checkpoint with a shard left out was told to set model.allow_pickle for .bin
    weights it does not have; a folder of .bin weights still is."""
    model = tiny_model(tmp_path / "sharded", max_shard_size="5MB")
    shards = sorted(model.glob("model-*.safetensors"))
    assert len(shards) > 1 and (model / "model.safetensors.index.json").is_file()
    shards[1].unlink()
    code, summary = run_job(tmp_path, model)
    assert code == 78 and str(shards[1]) in summary["error"]
    assert "allow_pickle" not in summary["error"]
    pickled = copy_of(model, tmp_path)
    for f in [*pickled.glob("model*.safetensors*")]:
        f.unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"")
    code, summary = run_job(tmp_path, pickled)
    assert code == 78 and "set model.allow_pickle: true" in summary["error"]


def test_messages_for_a_model_without_chat_template_are_78_before_any_row(llama_dir, tmp_path):
    """A base model has no chat template: a messages job failed every row alike
    ('no_chat_template'), after the model loaded, and exited 65."""
    model = copy_of(llama_dir, tmp_path)
    (model / "chat_template.jinja").unlink()
    conf = json.loads((model / "tokenizer_config.json").read_text())
    conf.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(conf))
    (tmp_path / "in.jsonl").write_text(
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "Hi"}]}) + "\n"
    )
    job = {
        "model": {"source": str(model), "dtype": "float32"},
        "input": {"path": "in.jsonl", "prompt": {"messages_column": "messages"}},
        "output": {"path": "out"},
    }
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    for command in ("validate", "run"):
        result = CliRunner().invoke(app, [command, str(tmp_path / "job.yaml")])
        error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
        assert result.exit_code == 78, error
        assert error.startswith("input.prompt.messages_column: the model's tokenizer has no chat")


def test_a_model_on_the_static_engine_gets_structured_outputs(tmp_path):
    """A GPT-2-architecture model runs on the static engine, which refused every constrained
    row (`unsupported`): a job asking for labels now gets one label a row, marked complete."""
    model = tiny_model(tmp_path / "model", "gpt2")
    labels = ["positive", "negative", "neutral"]
    code, summary = run_job(tmp_path, model, choice=labels, max_new_tokens=8)
    assert code == 0, summary
    results = (tmp_path / "out" / "results" / "part-00000.jsonl").read_text()
    rows = [json.loads(x) for x in results.splitlines()]
    assert len(rows) == 2
    assert all(r["completion"] in labels and r["structure"] == "complete" for r in rows), rows
