"""Where files live: local paths, or any store fsspec knows (s3://, gs://, az://, hf://, file://).

Readers and the run directory go through these few functions, never through a storage client of
their own. Credentials come from each store's own chain (environment, config files, instance
roles); nothing here reads them from the job file or writes them anywhere. The S3 endpoint comes
from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, so one job runs against S3, MinIO or a test server.
`hf://datasets/...` is read from the local Hugging Face cache when HF_HUB_OFFLINE is set.
"""

from __future__ import annotations

import glob as _glob
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

from jobrunner.errors import ConfigError

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# The package each store needs, named by the extra that installs it (pyproject.toml).
EXTRAS = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}
EXTRAS |= {"az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure")}
ANON_ENV = "JOBRUNNER_ANONYMOUS"
# Stores whose `pipe_file(mode="create")` is a real conditional write (S3 If-None-Match: *).
CONDITIONAL_CREATE = {"s3", "s3a"}


def scheme(path: str) -> str:
    m = _SCHEME.match(str(path))
    return m[1].lower() if m else ""


def is_remote(path: str | os.PathLike) -> bool:
    """True for a store URL; plain paths and file:// are local."""
    return scheme(str(path)) not in ("", "file", "local")


def local_path(path: str) -> str:
    """A local path for a plain path, file:// URL, or hf:// path served from the local cache."""
    s = scheme(path)
    if s in ("file", "local"):
        return path.split("://", 1)[1]
    if s == "hf" and os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        return _hf_cached(path)
    return path


def filesystem(path: str, anonymous: bool | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for a store URL. Anonymous (unsigned) access for
    public buckets: `anonymous=True` or JOBRUNNER_ANONYMOUS=1."""
    s = scheme(path)
    if anonymous is None:
        anonymous = os.environ.get(ANON_ENV, "") not in ("", "0")
    try:
        import fsspec
    except ImportError as e:  # pragma: no cover - fsspec comes with the base install
        raise ConfigError("reading store URLs needs fsspec: pip install fsspec") from e
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    try:
        fs = _filesystem(s, anonymous, endpoint if s in ("s3", "s3a") else None)
    except (ImportError, ValueError) as e:
        pkg, extra = EXTRAS.get(s, (s, s))
        raise ConfigError(
            f"{path}: the {s}:// store needs {pkg}: pip install 'jobrunner[{extra}]' ({e})"
        ) from e
    return fs, fsspec.core.strip_protocol(path) if s != "hf" else path.split("://", 1)[1]


@lru_cache(maxsize=8)
def _filesystem(s: str, anonymous: bool, endpoint: str | None) -> Any:
    import logging

    import fsspec

    logging.getLogger("aiobotocore.credentials").setLevel(logging.WARNING)  # "found credentials"

    return fsspec.filesystem(s, **_store_options(s, anonymous, endpoint))


def _store_options(s: str, anonymous: bool, endpoint: str | None) -> dict[str, Any]:
    # Listings are never cached: the commit protocol must see other writers' objects.
    opts: dict[str, Any] = {"use_listings_cache": False, "skip_instance_cache": True}
    if s in ("s3", "s3a"):
        if endpoint:
            opts["endpoint_url"] = endpoint
        if anonymous:
            opts["anon"] = True
    elif s in ("gs", "gcs") and anonymous:
        opts["token"] = "anon"
    elif s in ("az", "abfs", "abfss") and anonymous:
        opts["anon"] = True
    return opts


def url(fs: Any, path: str) -> str:
    """The URL of `path` on `fs` (what users see in messages and what the fingerprint holds)."""
    proto = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    return f"{proto}://{path}"


def glob_files(path: str, anonymous: bool | None = None) -> list[str]:
    """Every file at `path` on its store: the object itself (first, as a local file is: a key
    may hold `[`, `*` or `?`), the objects a glob matches, or a prefix's objects."""
    fs, p = filesystem(path, anonymous)
    if fs.isfile(p):
        found = [p]
    elif _glob.has_magic(p):
        found = [f for f in fs.glob(p) if fs.isfile(f)]
    else:
        found = fs.find(p)
    return sorted(url(fs, f) for f in found)


def missing_bucket(path: str) -> str | None:
    """The bucket of an s3:// `path` where the store says it does not exist, else None. Only
    a 404 counts: credentials that may not look at the bucket may still read or write under
    their prefix, and a store that cannot be reached raises (store_errors: 75)."""
    fs, p = filesystem(path)
    bucket = p.split("/", 1)[0]
    if scheme(path) not in ("s3", "s3a"):
        return None
    try:
        fs.call_s3("head_bucket", Bucket=bucket)
    except FileNotFoundError:
        return bucket
    except PermissionError:
        pass
    return None


def open_file(path: str, mode: str = "rb", anonymous: bool | None = None) -> IO:
    """A file object for a local path or a store URL."""
    if not is_remote(path):
        return open(local_path(path), mode)
    fs, p = filesystem(path, anonymous)
    return fs.open(p, mode)


def file_size(path: str, anonymous: bool | None = None) -> int:
    if not is_remote(path):
        return os.path.getsize(local_path(path))
    fs, p = filesystem(path, anonymous)
    return int(fs.size(p))


def file_stat(path: str) -> tuple[int, int]:
    """(size in bytes, last-modified time in ns) of a local file or a store object."""
    if not is_remote(path):
        st = os.stat(local_path(path))
        return st.st_size, st.st_mtime_ns
    fs, p = filesystem(path)
    info = fs.info(p)
    when = info.get("LastModified") or info.get("mtime") or info.get("updated") or 0
    if hasattr(when, "timestamp"):
        when = when.timestamp()
    elif isinstance(when, str):
        from datetime import datetime

        when = datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
    return int(info["size"]), int(float(when) * 1e9)


def _hf_cached(path: str) -> str:
    """`hf://datasets/owner/name[@rev]/file-or-glob` in the local HF cache (offline mode)."""
    rest = path.split("://", 1)[1]
    parts = rest.split("/")
    if len(parts) < 3 or parts[0] != "datasets":
        raise ConfigError(f"{path}: expected hf://datasets/<owner>/<name>/<path>")
    name, _, revision = parts[2].partition("@")
    repo = f"{parts[1]}/{name}"
    from huggingface_hub import snapshot_download

    try:
        root = snapshot_download(
            repo, repo_type="dataset", revision=revision or None, local_files_only=True
        )
    except Exception as e:  # the hub raises several types for "not in the cache"
        raise ConfigError(
            f"{path}: dataset {repo} is not in the local Hugging Face cache and HF_HUB_OFFLINE"
            " is set; download it first (huggingface-cli download --repo-type dataset"
            f" {repo}) or unset HF_HUB_OFFLINE"
        ) from e
    return str(Path(root, *parts[3:]))
