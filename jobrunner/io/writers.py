"""Write files atomically: a temporary name, flush + fsync, then rename.

A shard's records are written by its format's writer (formats/), passed in.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jobrunner.errors import ConfigError
from jobrunner.types import Choice, Result, TokenLogprob


def result_record(r: Result, model: str) -> dict[str, Any]:
    """The result row: input columns first, then the result columns of DESIGN.md. `completion`
    and `finish_reason` are the first choice's; `logprobs` (the first choice's tokens) appears
    when the row asked for logprobs, `choices` (every sample) when it has more than one."""
    rec = {
        **r.columns,
        "id": r.id,
        "completion": r.completion,
        "finish_reason": r.finish_reason.value,
        "prompt_tokens": r.usage.prompt_tokens,
        "cached_tokens": r.usage.cached_tokens,
        "completion_tokens": r.usage.completion_tokens,
        "cost_usd": r.usage.cost_usd,
        "model": model,
        "structure": r.structure,
        **({"embedding": r.embedding} if r.embedding is not None or r.meta.get("embed") else {}),
    }
    if r.choices and r.choices[0].logprobs is not None:
        rec["logprobs"] = logprob_records(r.choices[0].logprobs)
    if len(r.choices) > 1:
        rec["choices"] = [choice_record(c) for c in r.choices]
    return rec


def choice_record(c: Choice) -> dict[str, Any]:
    return {
        "index": c.index,
        "text": c.text,
        "finish_reason": c.finish_reason.value,
        "completion_tokens": len(c.token_ids),
        "logprobs": None if c.logprobs is None else logprob_records(c.logprobs),
        "structure": c.structure,
    }


def logprob_records(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """One record per generated token: token, token_id, logprob, bytes, top_logprobs (each
    alternative a record of the same four fields)."""
    return [
        {**_token_fields(e), "top_logprobs": [_token_fields(a) for a in e.top_logprobs]}
        for e in entries
    ]


def _token_fields(e: TokenLogprob) -> dict[str, Any]:
    return {"token": e.token, "token_id": e.token_id, "logprob": e.logprob, "bytes": e.bytes}


Write = Callable[[list[dict[str, Any]], Path], None]


def write_atomic(records: list[dict[str, Any]], path: Path, write: Write) -> None:
    """`path` appears complete (as `write(records, tmp)` made it) or not at all."""
    publish(write_temp(records, path, write), path)


def write_temp(records: list[dict[str, Any]], path: Path, write: Write) -> Path:
    """The file under its temporary name, fsynced; nothing is left behind if this raises."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with naming(path):
            write(records, tmp)
            fsync_file(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def publish(tmp: Path, path: Path) -> None:
    """Rename a `write_temp` file into place (atomic), then make the rename durable."""
    try:
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def unwritable(records: list[dict[str, Any]], write: Write) -> dict[int, Exception]:
    """The records `write` cannot write on their own, by index, with the reason."""
    import tempfile

    bad: dict[int, Exception] = {}
    with tempfile.TemporaryDirectory(prefix="jobrunner-row-") as d:
        for i, r in enumerate(records):
            try:
                write([r], Path(d) / "row")
            except OSError:
                raise  # the disk's fault, not the row's
            except Exception as e:  # the value's own fault: that row fails, the rest are written
                bad[i] = e
    return bad


def check_file_target(path: Path, option: str) -> None:
    """A file the user asked us to write (`option` names where they did): refused (78) before
    any work when it could not be written. Its folder must exist: a mistyped folder is named,
    never created."""
    folder = path.absolute().parent
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a directory; give the path of a file")
    if not folder.is_dir():
        state = "is a file, not a folder" if folder.exists() else "does not exist"
        raise ConfigError(
            f"{option} {path}: the folder {folder} {state}; create it first, or give another path"
        )
    try:  # the folder lets us make a file there (/proc, read-only, not ours: no)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.probe", dir=folder)
    except OSError as e:
        raise ConfigError(
            f"{option} {path}: cannot write in {folder} ({e.strerror or e}); give another path"
        ) from e
    os.close(fd)
    os.unlink(probe)


def write_text_atomic(path: Path, text: str) -> None:
    """`path` appears complete or not at all; no temporary file survives an error."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with naming(path), open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError raised without a file name (a write, a flush, pyarrow's) gets `path`, so the
    user learns where the disk was full or read-only."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
