"""Checks of a local checkpoint's files that transformers leaves to a traceback or passes over: a
safetensors file cut short (a download or copy that stopped), weights whose shapes config.json
does not describe, a generation_config.json that does not read (transformers drops it, and with
it the EOS ids a chat turn ends with), a folder without tokenizer files, a tokenizer larger than
the embeddings, weights the checkpoint lacks (started at random). Each is the user's to fix: a
ConfigError (78) that names the file."""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobrunner.errors import ConfigError


def check_safetensors(weights_dir: str) -> None:
    """Every *.safetensors file in the folder holds its whole header and the bytes it names."""
    for path in sorted(Path(weights_dir).glob("*.safetensors")):
        why = _safetensors_damage(path)
        if why:
            raise ConfigError(f"model.source: {path} is damaged ({why}); download or copy it again")


def check_generation_config(weights_dir: str) -> None:
    """generation_config.json, where there is one, is a JSON object: transformers falls back to
    config.json's ids without a word when it is not, and a Llama-3-style model then never stops
    at the end of its turn (<|eot_id|> is listed there only)."""
    path = Path(weights_dir) / "generation_config.json"
    if not path.is_file():
        return
    try:
        ok = isinstance(json.loads(path.read_bytes()), dict)
    except ValueError as e:
        ok, why = False, str(e)
    else:
        why = "not a JSON object"
    if not ok:
        raise ConfigError(
            f"model.source: {path} does not read ({why}); it holds the model's EOS ids: restore"
            " it from the model's files"
        )


def check_vocabulary(tokenizer: Any, model: Any, where: str) -> None:
    """Every id the tokenizer can give has a row in the model's embeddings: tokens added to a
    tokenizer without the embeddings resized put ids past them in prompts (torch's 'index out
    of range' in the middle of a run)."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ConfigError(
            f"model.source: the tokenizer in {where} has {len(tokenizer)} tokens, the model's"
            f" embeddings {rows} rows (config.json vocab_size {model.config.vocab_size}): ids"
            f" from {rows} on cannot be run; save the model after"
            " model.resize_token_embeddings(len(tokenizer)), or use the tokenizer saved with it"
        )


def check_config_vocabulary(tokenizer: Any, where: str) -> None:
    """check_vocabulary before any weight is read (validate, estimate): config.json's
    vocab_size is the embeddings' rows (the loader refuses weights of other shapes)."""
    path = Path(where) / "config.json"
    try:
        conf = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # a GGUF file, or no config.json: the loader says what it finds
    conf = conf if isinstance(conf, dict) else {}
    rows = conf.get("vocab_size") or (conf.get("text_config") or {}).get("vocab_size")
    if isinstance(rows, int) and len(tokenizer) > rows:
        raise ConfigError(
            f"model.source: the tokenizer in {where} has {len(tokenizer)} tokens, the model's"
            f" embeddings {rows} rows (config.json vocab_size): ids from {rows} on cannot be"
            " run; save the model after model.resize_token_embeddings(len(tokenizer)), or use"
            " the tokenizer saved with it"
        )


def check_complete(missing: set[str], where: str, archs: list[str] | None) -> None:
    """Every weight a generate job reads came from the checkpoint: transformers starts the ones
    it lacks at random (a classifier or reward model's folder, loaded for generation, has no
    LM head) and the job's output would be noise."""
    if not missing:
        return
    names = sorted(missing)
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    raise ConfigError(
        f"model.source: {where} has no weights for {', '.join(names[:3])}{more}, which"
        f" transformers would start at random (its architectures: {', '.join(archs or ['?'])});"
        " give a causal language model checkpoint with all its weights"
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def missing_tokenizer(where: str) -> str:
    """A hint for a model folder with none of the usual tokenizer files, else ''."""
    p = Path(where)
    if not p.is_dir() or any((p / name).is_file() for name in TOKENIZER_FILES):
        return ""
    return (
        f" ({where} has no tokenizer file: none of {', '.join(TOKENIZER_FILES)}; copy the"
        " tokenizer saved with the model into it)"
    )


def _safetensors_damage(path: Path) -> str | None:
    """What is wrong with a safetensors file, read from its header alone, or None: the 8-byte
    header length, the JSON header, and the end of its last tensor's bytes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a safetensors header"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return f"its header needs {8 + n} bytes, the file has {size}"
        try:
            header = json.loads(f.read(n))
            end = max(
                (t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "its header is not a safetensors header"
    if 8 + n + end > size:
        return f"its tensors need {8 + n + end} bytes, the file has {size}: it was cut short"
    return None


@contextlib.contextmanager
def weights_match(weights_dir: str) -> Iterator[None]:
    """transformers' refusal of weights whose shapes config.json does not give (a vocab_size or
    hidden_size edited, the weights of another model) as a ConfigError naming both files."""
    try:
        yield
    except RuntimeError as e:
        if "mismatched_sizes" not in str(e) and "size mismatch" not in str(e):
            raise
        raise ConfigError(
            f"model.source: the weights in {weights_dir} do not have the shapes its config.json"
            " gives (transformers' load report above names each one); config.json must be the"
            " one saved with these weights"
        ) from e
