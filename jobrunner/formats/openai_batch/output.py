"""OpenAI Batch API output, in the run directory:
  output.jsonl  one line per succeeded request, shaped like the Batch API's output file:
                `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`
                with a `chat.completion`, `text_completion` or (/v1/responses) `response`
                body, or for /v1/embeddings a
                CreateEmbeddingResponse (one line per request, its inputs' rows joined);
  errors.jsonl  one line per failed request: `{"id", "custom_id", "response": null,
                "error": {"code", "message", "param", "line"}}` plus the usual jobrunner fields
                (file, row, line, field, code, message) that resume and the reports read;
  batch.json    a Batch object: status, request_counts, usage totals, cost in metadata.
output.jsonl and batch.json are assembled from the committed shards when the job finishes.
Line order follows completion, not input (as with the Batch API): join on custom_id.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobrunner.formats.openai_batch.embeddings import EMBEDDINGS, EmbeddingLines, embedding_body
from jobrunner.formats.openai_batch.read import (
    CHAT,
    COMPLETIONS,
    RESPONSES,
    BatchLineError,
    endpoint,
)
from jobrunner.io.writers import fsync_dir, fsync_file, write_text_atomic
from jobrunner.types import RowError

# Rejections the API answers with an HTTP 400 (a request it refuses), not a batch-level error.
CONTEXT_ERRORS = {"too_long", "prompt_too_long"}
OUTPUT_FILE = "output.jsonl"
BATCH_FILE = "batch.json"
ERRORS_FILE = "errors.jsonl"


# ---------------------------------------------------------------- errors.jsonl


def error_record(e: RowError) -> dict[str, Any]:
    """An errors.jsonl line: the Batch API's shape first, then jobrunner's own fields.

    A line without a usable custom_id is named by its derived id (file:row), so every error
    line has a string custom_id. A prompt too long for the model is answered as the API answers
    it: `response` holds an HTTP 400 with an `invalid_request_error` body and `error` is null.
    """
    custom_id = e.custom_id if isinstance(e, BatchLineError) else e.id
    own = e.to_json()
    rid = _hash(str(own["id"]), str(own["line"]), str(own["row"]))
    line = own["line"] if own["line"] is not None else own["row"]
    head = {"id": own.pop("id"), "custom_id": custom_id or own_id(e)}
    if e.code in CONTEXT_ERRORS:
        param = (e.field or "").removeprefix("body.") or None
        error = {
            "message": e.message,
            "type": "invalid_request_error",
            "param": param,
            "code": "context_length_exceeded",
        }
        response = {"status_code": 400, "request_id": f"req_{rid}", "body": {"error": error}}
        return {**head, "response": response, "error": None, **own}
    error = {"code": e.code, "message": e.message, "param": e.field, "line": line}
    return {**head, "response": None, "error": error, **own}


def own_id(e: RowError) -> str:
    """The id jobrunner gives a line: its row id, else file:row."""
    if e.id:
        return e.id
    src = e.source
    return f"{os.path.basename(src.file)}:{src.row}" if src else "unknown"


# ---------------------------------------------------------------- output.jsonl


def _hash(*parts: str) -> str:
    return hashlib.blake2b("\x00".join(parts).encode(), digest_size=12).hexdigest()


# What OpenAI's bodies count that a local model never spends: present, as zeros, for code that
# reads them (a reasoning-token cost split, say).
NO_COMPLETION_DETAILS = {
    "reasoning_tokens": 0,
    "audio_tokens": 0,
    "accepted_prediction_tokens": 0,
    "rejected_prediction_tokens": 0,
}


def _usage(rec: dict[str, Any]) -> dict[str, Any]:
    p, c = rec["prompt_tokens"], rec["completion_tokens"]
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": rec["cached_tokens"], "audio_tokens": 0},
        "completion_tokens_details": dict(NO_COMPLETION_DETAILS),
    }


def _choices(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's choices (one record field per sample, or the single completion)."""
    return rec.get("choices") or [
        {
            "index": 0,
            "text": rec["completion"],
            "finish_reason": rec["finish_reason"],
            "logprobs": rec.get("logprobs"),
        }
    ]


def _top(a: dict[str, Any]) -> dict[str, Any]:
    return {"token": a["token"], "logprob": a["logprob"], "bytes": a["bytes"]}


def chat_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """OpenAI's ChoiceLogprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    if entries is None:
        return None
    content = [{**_top(e), "top_logprobs": [_top(a) for a in e["top_logprobs"]]} for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The completions endpoint's legacy shape: tokens, token_logprobs, top_logprobs (a
    {token: logprob} map per position) and text_offset (into the completion text)."""
    if entries is None:
        return None
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def chat_body(rec: dict[str, Any], rid: str, created: int) -> dict[str, Any]:
    choices = []
    for c in _choices(rec):
        call_id = f"call_{rid}" + (f"_{c['index']}" if c["index"] else "")
        message, finish = _message(c["text"], c["finish_reason"], rec.get("tool_call"), call_id)
        choices.append(
            {
                "index": c["index"],
                "message": message,
                "logprobs": chat_logprobs(c["logprobs"]),
                "finish_reason": finish,
            }
        )
    return {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": created,
        "model": rec["model"],
        "choices": choices,
        "usage": _usage(rec),
        "system_fingerprint": None,
    }


def _message(text: str, finish: str, tool: str | None, call_id: str) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason. A forced tool call (the `tool_call` column: the
    named function, or "" when the output names it) is answered as the API answers it:
    `tool_calls` with the arguments as JSON text, content null, finish_reason "tool_calls".
    One cut short by max_tokens stays text, with "length"."""
    call = _tool_call(text, tool) if tool is not None and finish == "stop" else None
    if call is None:
        return {"role": "assistant", "content": text, "refusal": None}, finish
    name, arguments = call
    tool_call = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
    message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [tool_call]}
    return message, "tool_calls"


def _tool_call(text: str, tool: str) -> tuple[str, Any] | None:
    """(name, arguments) from the constrained output: the arguments of the named function,
    or `{"name": ..., "arguments": {...}}` under tool_choice "required"."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if tool:
        return tool, value
    if isinstance(value, dict) and isinstance(value.get("name"), str) and "arguments" in value:
        return value["name"], value["arguments"]
    return None


def completion_body(rec: dict[str, Any], rid: str, created: int) -> dict[str, Any]:
    choices = [
        {
            "index": c["index"],
            "text": c["text"],
            "logprobs": completion_logprobs(c["logprobs"]),
            "finish_reason": c["finish_reason"],
        }
        for c in _choices(rec)
    ]
    return {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        "created": created,
        "model": rec["model"],
        "choices": choices,
        "usage": _usage(rec),
        "system_fingerprint": None,
    }


def response_body(rec: dict[str, Any], rid: str, created: int) -> dict[str, Any]:
    """A Response (openai.types.responses.Response): one assistant message of output_text;
    `incomplete` with reason max_output_tokens when the answer was cut by length. The request's
    own settings (instructions, temperature, text, ...) are not echoed: they are null."""
    c = _choices(rec)[0]
    status = "incomplete" if c["finish_reason"] == "length" else "completed"
    text = {"type": "output_text", "text": c["text"], "annotations": []}
    if c["logprobs"] is not None:
        text["logprobs"] = chat_logprobs(c["logprobs"])["content"]
    p, o = rec["prompt_tokens"], rec["completion_tokens"]
    message = {"type": "message", "id": f"msg_{rid}", "status": status, "role": "assistant"}
    return {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": created,
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "error": None,
        "model": rec["model"],
        "output": [{**message, "content": [text]}],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": p,
            # no cache writes are billed locally: zero, for code that reads the field
            "input_tokens_details": {
                "cached_tokens": rec["cached_tokens"],
                "cache_write_tokens": 0,
            },
            "output_tokens": o,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + o,
        },
    }


BODIES = {CHAT: chat_body, COMPLETIONS: completion_body, RESPONSES: response_body}


def output_line(rec: dict[str, Any], salt: str, created: int) -> dict[str, Any]:
    """One succeeded shard record as a Batch API output line (ids are stable per job + row)."""
    rid = _hash(salt, str(rec["id"]))
    body = BODIES[endpoint(rec.get("url")) or CHAT](rec, rid, created)
    return _line(rid, rec["id"], body)


def embeddings_line(recs: list[dict[str, Any]], salt: str) -> dict[str, Any]:
    """One /v1/embeddings request's rows (one per input) as its output line."""
    cid = recs[0]["custom_id"]
    return _line(_hash(salt, cid), cid, embedding_body(recs))


def _line(rid: str, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"batch_req_{rid}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": f"req_{rid}", "body": body},
        "error": None,
    }


# ---------------------------------------------------------------- assembly


@dataclass
class Totals:
    completed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, rec: dict[str, Any], lines: int = 1) -> None:
        self.completed += lines
        for k in ("prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd"):
            setattr(self, k, getattr(self, k) + (rec.get(k) or 0))


def finalize(rundir, manifest, cfg) -> None:
    """Write output.jsonl (streamed, atomic) and batch.json from the committed shards."""
    salt = json.dumps(manifest.fingerprint, sort_keys=True)
    path = rundir.path / OUTPUT_FILE
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    totals, endpoints, embeddings = Totals(), Counter(), EmbeddingLines()
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            for rec, created in _succeeded(rundir.shard_files()):
                if rec.get("url") == EMBEDDINGS:  # one line per request, from its inputs' rows
                    recs = embeddings.add(rec)
                    line = embeddings_line(recs, salt) if recs else None
                else:
                    line = output_line(rec, salt, created)
                if line is None:
                    totals.add(rec, lines=0)
                    continue
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
                totals.add(rec)
                url = rec.get("url")
                endpoints[EMBEDDINGS if url == EMBEDDINGS else endpoint(url) or CHAT] += 1
        fsync_file(tmp)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
    failed = sum(1 for _ in rundir.iter_errors())
    batch = batch_object(cfg, manifest, salt, totals, failed, endpoints)
    write_text_atomic(rundir.path / BATCH_FILE, json.dumps(batch, indent=1) + "\n")


def _succeeded(shards: list[Path]) -> Iterator[tuple[dict[str, Any], int]]:
    for shard in shards:
        created = int(shard.stat().st_mtime)
        with open(shard, encoding="utf-8") as f:
            for line in f:
                if line.strip() and (rec := json.loads(line))["finish_reason"] != "error":
                    yield rec, created


def batch_object(
    cfg, manifest, salt: str, t: Totals, failed: int, endpoints: Counter
) -> dict[str, Any]:
    """A Batch object (openai.types.Batch) describing the finished job.

    `endpoint` is one API endpoint, as a Batch has: that of most succeeded lines (a file may mix
    chat, responses and completions lines; `metadata.endpoints` then lists each with its count).
    `error_file_id` is null when no line failed, as the API has it.
    """
    now = int(time.time())
    main = max(sorted(endpoints), key=endpoints.__getitem__) if endpoints else CHAT
    metadata = {"job": cfg.name, "cost_usd": f"{t.cost_usd:.12f}"}
    if len(endpoints) > 1:
        metadata["endpoints"] = ",".join(f"{k}={endpoints[k]}" for k in sorted(endpoints))
    return {
        "id": f"batch_{_hash(salt)}",
        "object": "batch",
        "endpoint": main,
        "errors": None,
        "input_file_id": cfg.input.path,
        "completion_window": "24h",
        "status": "completed",
        "output_file_id": OUTPUT_FILE,
        "error_file_id": ERRORS_FILE if failed else None,
        "created_at": int(manifest.started_at or now),
        "in_progress_at": int(manifest.started_at or now),
        "finalizing_at": int(manifest.finished_at or now),
        "completed_at": int(manifest.finished_at or now),
        "model": cfg.model.source,
        "request_counts": {
            "total": t.completed + failed,
            "completed": t.completed,
            "failed": failed,
        },
        "usage": {
            "input_tokens": t.prompt_tokens,
            "input_tokens_details": {"cached_tokens": t.cached_tokens},
            "output_tokens": t.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": t.prompt_tokens + t.completion_tokens,
        },
        "metadata": metadata,
    }
