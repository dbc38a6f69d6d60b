"""Tiny random Hugging Face checkpoints of any architecture, written the way users bring their
own models: a local directory with config.json, safetensors weights, generation_config.json and
the built-in model's tokenizer (its vocabulary sizes the model)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


@functools.cache
def builtin_tokenizer():
    from jobrunner.config import ModelConfig
    from jobrunner.engine.loader import load_tokenizer

    return load_tokenizer(ModelConfig())


def tiny_model(
    path: Path,
    model_type: str = "llama",
    config: dict[str, Any] | None = None,
    generation: dict[str, Any] | None = None,
    seed: int = 0,
    **save: Any,
) -> Path:
    """A random float32 model saved in `path`, its logits sharpened so greedy near-ties are
    rare. `generation` replaces the generation_config.json's fields (eos ids, penalties)."""
    import torch
    import transformers

    tok = builtin_tokenizer()
    conf = transformers.CONFIG_MAPPING[model_type](
        **{**SHAPE, "vocab_size": len(tok), "eos_token_id": tok.eos_token_id, **(config or {})}
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.save_pretrained(path, **save)
    tok.save_pretrained(path)
    if generation:
        gen = path / "generation_config.json"
        gen.write_text(json.dumps({**json.loads(gen.read_text()), **generation}))
    return path


def chat_prompts(texts: list[str]) -> list[list[int]]:
    tok = builtin_tokenizer()
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
        for t in texts
    ]
