"""Where files live: local paths, or any store fsspec knows (s3://, gs://, az://, hf://, file://).

Readers and the run directory go through these few functions, never through a storage client of
their own. Credentials come from each store's own chain (environment, config files, instance
roles); nothing here reads them from the job file or writes them anywhere. The S3 endpoint comes
from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, so one job runs against S3, MinIO or a test server;
gcsfs takes STORAGE_EMULATOR_HOST and adlfs AZURE_STORAGE_CONNECTION_STRING the same way.
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
AZURE = ("az", "abfs", "abfss")
ANON_ENV = "JOBRUNNER_ANONYMOUS"
# Stores whose `pipe_file(mode="create")` is a real conditional write: S3 If-None-Match: *,
# GCS ifGenerationMatch=0 (gcsfs >= 2024.12), Azure If-None-Match: * (adlfs >= 2024.12).
CONDITIONAL_CREATE = {"s3", "s3a", "gs", "gcs", *AZURE}


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
    if s in AZURE:
        _check_azure_url(path)
    try:
        fs = _filesystem(s, anonymous, endpoint if s in ("s3", "s3a") else None, _client_env(s))
    except (ImportError, ValueError) as e:
        if s in AZURE and isinstance(e, ValueError):  # adlfs: no account to connect to
            raise ConfigError(
                f"{path}: no Azure storage account to connect to ({e}): set"
                " AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with"
                " AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN"
            ) from e
        pkg, extra = EXTRAS.get(s, (s, s))
        raise ConfigError(
            f"{path}: the {s}:// store needs {pkg}: pip install 'jobrunner[{extra}]' ({e})"
        ) from e
    return fs, fsspec.core.strip_protocol(path) if s != "hf" else path.split("://", 1)[1]


def _check_azure_url(path: str) -> None:
    """adlfs reads `az://container/path` in the account its credentials name. An account in
    the URL (`abfss://container@account.dfs.core.windows.net/path`, as Spark writes it) would
    be ignored for that one, so it is refused rather than read from another account."""
    host = path.split("://", 1)[1].split("/", 1)[0]
    if "@" in host:
        container, _, account = host.partition("@")
        raise ConfigError(
            f"{path}: write the URL as {scheme(path)}://{container}/... and name the account"
            f" ({account.split('.', 1)[0]}) in AZURE_STORAGE_ACCOUNT_NAME or"
            " AZURE_STORAGE_CONNECTION_STRING: the account is taken from the credentials"
        )


def _client_env(s: str) -> tuple[str, ...]:
    """The variables `s`'s client reads when it is made (its endpoint, its account): a client
    is made anew when they change."""
    names = {"gs": ("STORAGE_EMULATOR_HOST",), "gcs": ("STORAGE_EMULATOR_HOST",)}
    azure = ("CONNECTION_STRING", "ACCOUNT_NAME", "ACCOUNT_KEY", "SAS_TOKEN", "ANON")
    names |= dict.fromkeys(AZURE, tuple(f"AZURE_STORAGE_{n}" for n in azure))
    return tuple(os.environ.get(n, "") for n in names.get(s, ()))


@lru_cache(maxsize=8)
def _filesystem(s: str, anonymous: bool, endpoint: str | None, env: tuple[str, ...]) -> Any:
    import logging

    import fsspec

    logging.getLogger("aiobotocore.credentials").setLevel(logging.WARNING)  # "found credentials"
    # gcsfs logs each failure it gives up on with its traceback; the error raised says it all
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)

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
    elif s in AZURE and anonymous:
        opts["anon"] = True
    return opts


def glob_files(path: str, anonymous: bool | None = None) -> list[str]:
    """Every file at `path` on its store: the object itself (first, as a local file is: a key
    may hold `[`, `*` or `?`), the objects a glob matches, or a prefix's objects. URLs keep
    the scheme `path` is written with (`az://`, not adlfs's first name for it, `abfs://`)."""
    fs, p = filesystem(path, anonymous)
    if is_object(fs, p):
        found = [p]
    elif _glob.has_magic(p):
        found = [f for f in fs.glob(p) if fs.isfile(f)]
    else:
        found = _prefix_files(fs, p)
    return sorted(f"{scheme(path)}://{f}" for f in found)


def _prefix_files(fs: Any, prefix: str) -> list[str]:
    """The objects under `prefix`, less folder markers: a zero-byte `key/` (as a console's
    "create folder" makes). adlfs lists one without its slash, as `key`; only asking for that
    object tells it from an empty file (one request per empty object, on Azure only)."""
    found = fs.find(prefix, detail=True)
    azure = "abfs" in fs.protocol
    return [
        k
        for k, info in found.items()
        if not k.endswith("/") and (not azure or info.get("size") or is_object(fs, k))
    ]


def is_object(fs: Any, p: str) -> bool:
    """`fs.isfile(p)`, except that a store failing to answer raises instead of saying False:
    each question then costs the client's retries once, not once a caller. A 403 on S3's HEAD
    (no body, so no reason) is no object: the listing that follows says why."""
    try:
        return fs.info(p).get("type") == "file"
    except (FileNotFoundError, PermissionError):
        return False


def missing_bucket(path: str) -> str | None:
    """The bucket (an Azure container) of a store `path` where the store says it does not
    exist, else None. Only a 404 counts: credentials that may not look at the bucket may still
    read or write under their prefix, and a store that cannot be reached raises
    (store_errors: 75)."""
    fs, p = filesystem(path)
    bucket = p.split("/", 1)[0]
    try:
        if scheme(path) in ("s3", "s3a"):
            fs.call_s3("head_bucket", Bucket=bucket)
        elif scheme(path) in ("gs", "gcs", *AZURE):
            fs.info(bucket)
    except FileNotFoundError:
        return bucket
    except Exception as e:
        if not _denied(e):
            raise
    return None


def bucket_word(path: str) -> str:
    """What the store calls its top level: an Azure container, elsewhere a bucket."""
    return "container" if scheme(path) in AZURE else "bucket"


def _denied(e: Exception) -> bool:
    """A 403 as each client raises it: s3fs PermissionError, gcsfs OSError("Forbidden: ..."),
    azure-core HttpResponseError with its status."""
    if isinstance(e, PermissionError) or str(e).startswith("Forbidden: "):
        return True
    return getattr(e, "status_code", None) == 403


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
