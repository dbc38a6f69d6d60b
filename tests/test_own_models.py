"""A user's own Hugging Face checkpoint (`model.source: path/to/dir`): tiny random models of the
common architectures, built here, run exactly as HF generate runs them (float32, greedy)."""

from __future__ import annotations

import torch
from tinykit import chat_prompts, tiny_model

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
