"""Load a tokenizer (no weights) or a whole model, on the device and dtype the job asks for."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobrunner.config import ModelConfig
from jobrunner.engine.checkpoint import (
    check_config_vocabulary,
    check_generation_config,
    check_safetensors,
    check_vocabulary,
    missing_tokenizer,
    weights_match,
)
from jobrunner.engine.dtype_probe import choose_cpu_dtype
from jobrunner.engine.resolve import (
    GGUF_CACHE_SUFFIX,
    ModelSource,
    gguf_cache_path,
    resolve_source,
)
from jobrunner.errors import ConfigError, from_os_error

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel, eval mode, on `device`
    tokenizer: Any
    source: ModelSource
    device: Any  # torch.device
    dtype: Any  # torch.dtype
    weights_dir: str  # local HF directory holding config.json + safetensors
    encoder: bool = False  # an encoder (BERT family) loaded as AutoModel: embed jobs only
    dtype_reason: str = ""  # why this dtype (model.dtype auto: the rule or the measurement)
    # weights the checkpoint lacks, started at random by transformers: a generate job refuses
    # them (engines.make_engine); an embed job reads no LM head or pooler
    missing_weights: tuple[str, ...] = ()

    @property
    def hf_config(self) -> Any:
        return self.model.config

    @property
    def eos_token_ids(self) -> set[int]:
        return eos_ids(self.tokenizer, self.model.generation_config, self.model.config)


def eos_ids(tokenizer: Any, generation_config: Any = None, model_config: Any = None) -> set[int]:
    """The tokens that end a row: generation_config.json's EOS ids, config.json's and the
    tokenizer's. HF generate reads generation_config.json's alone; a generation_config.json
    saved without them (sampling settings only) left a chat model whose turn ends with an id
    config.json lists (Llama 3's <|eot_id|>) generating to max_new_tokens."""
    ids: set[int] = set()
    sources = (generation_config, model_config)
    for src in (*(getattr(s, "eos_token_id", None) for s in sources), tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif src:
            ids.update(int(x) for x in src)
    return ids


def load_tokenizer(cfg: ModelConfig) -> Any:
    """The job's tokenizer alone (validate/estimate): no weights are read."""
    where = local_dir_or_gguf(cfg)
    with model_files(where):
        tok = _tokenizer(where, cfg.trust_remote_code, cfg.revision)
    check_config_vocabulary(tok, where)
    return tok


@contextlib.contextmanager
def model_files(where: str) -> Iterator[None]:
    """What transformers refuses in the model's files is the user's to fix, never a bug: a hub
    id not in the cache, a file that is no GGUF, a config.json that is no JSON, a folder without
    a tokenizer or weights. One message for every command that reads them: 78 naming
    model.source. So is a package the model's files ask for and this environment lacks (an AWQ,
    GPTQ or bitsandbytes checkpoint's kernels): transformers' ImportError names what to
    install. An OSError the environment caused (a full disk) keeps its own code."""
    try:
        yield
    except (OSError, ValueError, ImportError) as e:  # a file refused, a package it needs
        if (env := from_os_error(e)) is not None:
            raise env from e
        raise ConfigError(f"model.source: cannot load {where}: {e}{_load_hint(e, where)}") from e


def _load_hint(e: Exception, where: str) -> str:
    text = str(e)
    if "tokenizer" in text.lower() and missing_tokenizer(where):
        return missing_tokenizer(where)
    if "safetensors" in text and _pickled_only(where):
        return " (set model.allow_pickle: true to load .bin weights)"
    if "trust_remote_code=True" in text:
        return " (set model.trust_remote_code: true to run the model's own code, if you trust it)"
    if "huggingface.co" in text and not Path(where).exists():  # a hub id, not a local folder
        return (
            " (jobrunner reads the hub offline: download the model first, e.g."
            " `hf download ORG/NAME`, or give its local folder)"
        )
    return ""


def _pickled_only(where: str) -> bool:
    """A folder whose weights are pickled (.bin) files (or a hub id: its files are not listed
    here), where safetensors were asked for: not one whose safetensors shard is missing."""
    p = Path(where)
    return not p.is_dir() or any(p.glob("*.bin")) or any(p.glob("*.pt"))


def load_model(cfg: ModelConfig) -> LoadedModel:
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    src = resolve_source(cfg.source)
    device = pick_device(cfg.device)
    weights_dir = _ensure_dense(src)
    dtype, dtype_reason = pick_dtype(cfg.dtype, device, weights_dir)
    encoder = is_encoder_dir(weights_dir)
    auto = AutoModel if encoder else AutoModelForCausalLM
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": cfg.trust_remote_code}
    if cfg.revision and src.kind == "hub":
        kwargs["revision"] = cfg.revision
    if not cfg.allow_pickle:
        kwargs["use_safetensors"] = True
    with model_files(weights_dir), weights_match(weights_dir):
        check_safetensors(weights_dir)  # (a link to a blob that is gone: 78 as well)
        check_generation_config(weights_dir)
        model, info = auto.from_pretrained(weights_dir, output_loading_info=True, **kwargs)
        tok = _tokenizer(weights_dir, cfg.trust_remote_code, None)
    check_vocabulary(tok, model, weights_dir)
    model.to(device).eval()
    torch.set_grad_enabled(False)
    log.info("loaded %s on %s as %s", src.name, device, str(dtype).removeprefix("torch."))
    missing = tuple(sorted(info.get("missing_keys") or ()))
    return LoadedModel(model, tok, src, device, dtype, weights_dir, encoder, dtype_reason, missing)


def is_encoder_dir(weights_dir: str) -> bool:
    """config.json names an encoder architecture (BertModel, XLMRobertaModel, ...): one without a
    language-model head, which is loaded as AutoModel (no weights read here)."""
    try:
        conf = json.loads((Path(weights_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    archs = conf.get("architectures") or []
    heads = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
    return (
        bool(archs)
        and not any(a.endswith(heads) for a in archs)
        and conf.get("model_type") not in ("llama", "mistral", "qwen2", "qwen3")
    )


def pick_device(name: str) -> Any:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device: {name!r} asked for but CUDA is not available here")
    return torch.device(name)


def pick_dtype(name: str, device: Any, weights_dir: str | None = None) -> tuple[Any, str]:
    """The compute dtype and why. `auto`: bfloat16 on CUDA (float16 where bf16 is not
    supported); on a CPU, whichever of float32 and bfloat16 measures faster on the model's
    shapes (engine/dtype_probe.py, cached per CPU model and thread count)."""
    import torch

    if name != "auto":
        return getattr(torch, name), "model.dtype"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, "auto: CUDA device"
        return torch.float16, "auto: CUDA device without bfloat16"
    hidden, intermediate = _linear_shape(weights_dir)
    if not hidden:
        return torch.float32, "auto: model shape unknown, float32"
    choice = choose_cpu_dtype(hidden, intermediate)
    return getattr(torch, choice.dtype), f"auto: {choice.reason}"


def _linear_shape(weights_dir: str | None) -> tuple[int, int]:
    """(hidden size, MLP size) from config.json; (0, 0) when it does not say."""
    try:
        conf = json.loads((Path(weights_dir or "") / "config.json").read_text())
    except (OSError, ValueError):
        return 0, 0
    hidden = conf.get("hidden_size") or conf.get("n_embd") or 0
    inter = conf.get("intermediate_size") or conf.get("n_inner") or 4 * hidden
    return (int(hidden), int(inter)) if isinstance(hidden, int) else (0, 0)


def local_dir_or_gguf(cfg: ModelConfig) -> str:
    """Where the model's files are: its directory, or a GGUF file (or its converted cache)."""
    src = resolve_source(cfg.source)
    if src.kind == "gguf":
        cached = gguf_cache_path(src)
        return str(cached) if (cached / "config.json").is_file() else str(src.gguf_path)
    return src.path


def _tokenizer(where: str, trust_remote_code: bool, revision: str | None) -> Any:
    if _is_gguf_cache(where):
        return _saved_tokenizer(where)
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    if where.endswith(".gguf"):
        p = Path(where)
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, **kwargs)
    return AutoTokenizer.from_pretrained(where, **kwargs)


def _is_gguf_cache(where: str) -> bool:
    """A dequantized GGUF's cache directory (`_dequantize_gguf` wrote its tokenizer files)."""
    p = Path(where)
    return p.parent.name == "gguf" and p.name.endswith(GGUF_CACHE_SUFFIX) and p.is_dir()


def _saved_tokenizer(where: str) -> Any:
    """The tokenizer `_dequantize_gguf` saved, by the class it was saved as: the one
    AutoTokenizer gives (tests/test_startup.py), without AutoTokenizer's import, which brings
    torch and transformers' configuration code (seconds `validate` needs for nothing else)."""
    conf = json.loads((Path(where) / "tokenizer_config.json").read_text())
    if conf.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(where)
    from transformers import AutoTokenizer  # saved by another transformers: let it choose

    return AutoTokenizer.from_pretrained(where)


def _ensure_dense(src: ModelSource) -> str:
    """A local HF dir with safetensors; a GGUF is dequantized once into the cache."""
    if src.kind != "gguf":
        return src.path
    target = gguf_cache_path(src)
    if (target / "config.json").is_file():
        return str(target)
    return _dequantize_gguf(src, target)


def _save_weights(model, path: Path) -> None:
    """One safetensors file in the HF layout: a tied LM head is not stored; its weight is saved
    once, under the input embeddings' name, as every HF checkpoint does (tools that read the
    file without transformers, vLLM among them, look for the embeddings there)."""
    from safetensors.torch import save_file

    emb = model.get_input_embeddings()
    keep = next(f"{name}.weight" for name, m in model.named_modules() if m is emb)
    ptr = emb.weight.data_ptr()
    state = {
        name: t.contiguous()
        for name, t in model.state_dict().items()
        if t.data_ptr() != ptr or name == keep  # drops the tied head
    }
    save_file(state, str(path), metadata={"format": "pt"})


def _dequantize_gguf(src: ModelSource, target: Path) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    _remove_stale_temps(target)
    tmp.mkdir(parents=True, exist_ok=True)  # the cache is writable before the expensive part
    log.info("dequantizing %s once into %s (later runs load the cache)", src.gguf_path, target)
    try:
        with model_files(str(src.gguf_path)):  # what transformers refuses in the file is 78
            model = AutoModelForCausalLM.from_pretrained(
                src.path, gguf_file=src.gguf_file, dtype=torch.float32
            )
            tok = AutoTokenizer.from_pretrained(src.path, gguf_file=src.gguf_file)
        # Written by hand: transformers refuses to serialize a model it loaded through GGUF.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        _save_weights(model, tmp / "model.safetensors")
        tok.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another run made it first (ENOTEMPTY/EEXIST): theirs is the same
            if not (target / "config.json").is_file():
                raise
    finally:  # an error or a signal leaves no half-written copy in the cache
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _remove_stale_temps(target: Path) -> None:
    """Temporary copies of processes that are gone (killed with -9 mid-write)."""
    for old in target.parent.glob(f"{target.name}.tmp*"):
        pid = old.name.rpartition(".tmp")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
