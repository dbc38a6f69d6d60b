"""Compressed line inputs (`corpus.jsonl.gz`, `rows.csv.zst`, a batch file `.jsonl.gz`) are
read as the plain files they hold: the same rows, ids, row and line numbers, through the row
readers, the id scan and the run schema, in a directory beside plain files; a file cut short
or damaged is exit 65 naming it, never a shorter file. No model here but the echo engine of
test_hostile_rows; the real model runs a compressed job in test_resume.py and test_e2e_cli.py.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from pathlib import Path

import pyarrow as pa
import pytest
from crashkit import read_results
from test_hostile_rows import echo_engine, run_job, tokenizer  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import JobConfig
from jobrunner.errors import InputDataError
from jobrunner.formats import input_files, input_format, read_rows, resolve_format
from jobrunner.io import csv_rows
from jobrunner.io.ids import iter_id_batches
from jobrunner.io.readers import RawRow
from jobrunner.resume import scan_ids

CODECS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".lz4": "lz4"}


def compress(data: bytes, suffix: str) -> bytes:
    """What the usual tools write: gzip's own module for .gz, pyarrow's streams for the rest."""
    if suffix == ".gz":
        return gzip.compress(data)
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, CODECS[suffix]) as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


def pack(plain: Path, suffix: str = ".gz", name: str | None = None) -> Path:
    """A compressed copy of `plain` beside it (`a.jsonl` -> `a.jsonl.gz`)."""
    packed = plain.with_name(name or plain.name + suffix)
    packed.write_bytes(compress(plain.read_bytes(), suffix))
    return packed


def items(path: Path, fmt: str = "auto") -> list[tuple]:
    """(kind, row, line, values or error code) of each item the reader yields."""
    return [
        (
            type(i).__name__,
            i.source.row,
            i.source.line,
            i.values if isinstance(i, RawRow) else i.code,
        )
        for i in read_rows(str(path), fmt)
    ]


def cli(*args) -> tuple[int, dict]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    lines = result.stdout.strip().splitlines()
    return result.exit_code, json.loads(lines[-1]) if lines else {}


JSONL = (
    b'\xef\xbb\xbf{"id": "a", "prompt": "one", "n": 1}\r\n'
    b"\n"
    b'{"id": "b", "prompt": "two", "n": 2.5}\n'
    b"{not json\n"
    b'{"id": "c", "prompt": "\xff bad utf-8"}\n'
    + b"".join(b'{"id": "r%d", "prompt": "p%d", "n": %d}\n' % (i, i, i) for i in range(3000))
    + b'{"id": "last", "prompt": "no line end"}'
)


@pytest.mark.parametrize("suffix", list(CODECS))
def test_every_codec_gives_the_plain_files_rows_lines_and_columns(tmp_path, suffix):
    plain = tmp_path / "in.jsonl"
    plain.write_bytes(JSONL)
    packed = pack(plain, suffix)
    assert items(packed) == items(plain)
    assert items(packed)[-1] == ("RawRow", 3004, 3006, {"id": "last", "prompt": "no line end"})
    fmt = input_format("jsonl")
    assert fmt.schema(str(packed)) == fmt.schema(str(plain))  # the run schema's pass


def test_a_gzipped_csv_with_quoted_newlines_is_the_plain_files_rows(tmp_path, monkeypatch):
    """Through small blocks, so rows (a quoted newline among them) straddle the reads of the
    decompressed stream; the row reader and the id scan agree with the plain file's."""
    rows = ["id,prompt\r\n", '0,"two\nlines"\r\n', "1,plain\r\n", "2,ragged,row\r\n"]
    rows += [f'{i},"say ""{i}""\n again"\n' for i in range(3, 400)] + ["0,dup\n"]
    plain = tmp_path / "in.csv"
    plain.write_text("".join(rows), encoding="utf-8")
    packed = pack(plain)
    monkeypatch.setattr(csv_rows, "BLOCK_BYTES", 64)
    got = items(packed)
    assert got == items(plain)
    assert got[0] == ("RawRow", 0, 2, {"id": "0", "prompt": "two\nlines"})
    assert got[2][::3] == ("RowError", "malformed_csv")
    assert got[-1][:3] == ("RawRow", 400, 800)  # line 800: every quoted row took two lines

    def scanned(path):
        return [
            i for _, b in iter_id_batches(str(path), "csv", "id") for i in b.column(0).to_pylist()
        ]

    assert scanned(packed) == scanned(plain)
    total, dups = scan_ids(JobConfig.model_validate({"input": {"path": str(packed)}}))
    assert total == 401
    assert dups == {"0": ["in.csv.gz:line 2", "in.csv.gz:line 800"]}  # the file, by its name
    assert input_format("csv").schema(str(packed)).names == ["id", "prompt"]


def test_auto_format_reads_the_suffix_under_the_codecs(tmp_path):
    batch_line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}
    files = {
        "rows.JSONL.GZ": b'{"prompt": "x"}\n',
        "rows.ndjson.bz2": b'{"prompt": "x"}\n',
        "rows.csv.zst": b"prompt\nx\n",
        "batch.jsonl.gz": json.dumps(batch_line).encode() + b"\n",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(compress(data, Path(name).suffix.lower()))
    got = {name: resolve_format(str(tmp_path / name), "auto") for name in files}
    assert got == {
        "rows.JSONL.GZ": "jsonl",
        "rows.ndjson.bz2": "jsonl",
        "rows.csv.zst": "csv",
        "batch.jsonl.gz": "openai-batch",
    }
    bare = tmp_path / "rows.gz"
    bare.write_bytes(gzip.compress(b'{"prompt": "x"}\n'))
    with pytest.raises(InputDataError, match=r"cannot tell the format from '\.gz'"):
        resolve_format(str(bare), "auto")
    assert [r.values for r in read_rows(str(bare), "jsonl")] == [{"prompt": "x"}]


@pytest.mark.parametrize("fmt", ["auto", "openai-batch"])
def test_a_compressed_embeddings_batch_file_is_an_embed_job_as_the_plain_one(tmp_path, fmt):
    """/v1/embeddings lines imply `task: embed`; read compressed, they did not, and every line
    failed as an unknown endpoint of a generate job."""
    from jobrunner.config import load_job

    line = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}
    plain = tmp_path / "batch.jsonl"
    plain.write_text(json.dumps(line) + "\n")
    packed = pack(plain, ".gz", "packed.jsonl.gz")
    for data in (plain, packed):
        job = tmp_path / f"{data.name}.yaml"
        job.write_text(f"input:\n  path: {data.name}\n  format: {fmt}\n")
        assert load_job(job).task == "embed", data.name


def test_a_directory_or_glob_of_embeddings_batch_files_is_an_embed_job(tmp_path, caplog):
    """The first batch file a directory, a glob or a store prefix names tells the task, as a
    file named alone does; a look that names no skipped file (only the input's listing does)."""
    from jobrunner.config import load_job

    line = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_text("the user's")
    pack_text = (json.dumps(line) + "\n").encode()
    (tmp_path / "in" / "b.jsonl.gz").write_bytes(gzip.compress(pack_text))
    for path in ("in", "in/*.jsonl.gz"):
        job = tmp_path / "job.yaml"
        job.write_text(f"input:\n  path: '{path}'\n")
        with caplog.at_level("WARNING"):
            assert load_job(job).task == "embed", path
    assert "notes.txt" not in caplog.text
    job.write_text("input:\n  path: in/notes.txt\n")  # another format's file: no guess
    assert load_job(job).task == "generate"


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("rows.parquet.gz", "a compressed parquet file is not read"),
        ("rows.jsonl.xz", r"\.xz files are not read .*\(xz -d\)"),
        ("rows.jsonl.zip", r"\.zip files are not read .*\(unzip\)"),
    ],
)
def test_what_is_not_read_compressed_is_refused_by_name_with_65(tmp_path, name, said):
    data = tmp_path / name
    data.write_bytes(gzip.compress(b"whatever\n"))
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"input": {"path": str(data)}, "output": {"path": "out"}}))
    code, summary = cli("validate", job)
    assert code == 65, summary
    assert str(data) in summary["error"]
    with pytest.raises(InputDataError, match=said):
        list(read_rows(str(data)))


def test_a_directory_reads_its_compressed_and_plain_files_as_one_input(
    echo_engine,  # noqa: F811
    tmp_path,
    caplog,
):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text('{"prompt": "plain"}\n')
    (data / "b.JSONL.GZ").write_bytes(gzip.compress(b'{"prompt": "gz 0"}\n{"prompt": "gz 1"}\n'))
    (data / "c.csv.zst").write_bytes(compress(b"prompt\nzst\n", ".zst"))
    (data / "d.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    (data / "e.jsonl.xz").write_bytes(b"\xfd7zXZ\x00")
    names = [Path(f).name for f in input_files(str(data))]
    assert names == ["a.jsonl", "b.JSONL.GZ", "c.csv.zst"]
    caplog.set_level(logging.WARNING)
    code, summary, out = run_job(tmp_path, data, id_column=None)
    assert code == 0, summary
    assert "2 files of no input format are not read (d.parquet.gz, e.jsonl.xz)" in caplog.text
    assert "compressed as input.path does not read (.parquet.gz, .xz)" in caplog.text
    ids = sorted(r["id"] for r in read_results(out))
    # a compressed file's derived ids are those of the file it holds
    assert ids == ["a.jsonl:0", "b.JSONL:0", "b.JSONL:1", "c.csv:0"]


def test_init_proposes_a_job_for_a_gzipped_csv_that_validates(tmp_path):
    data = tmp_path / "posts.csv.gz"
    data.write_bytes(gzip.compress(b"id,title,body\n1,A,first\n2,B,second\n"))
    code, summary = cli("init", data)
    assert code == 0, summary
    job = tmp_path / "posts.yaml"  # named after the file it holds, as posts.csv's job is
    assert summary["job"] == str(job)
    assert "# columns found: id, title, body" in job.read_text()
    code, summary = cli("validate", job)
    assert code == 0, summary
    assert (summary["rows"], summary["valid"]) == (2, 2)
    assert summary["output"] == str(tmp_path / "out" / "posts")


def _truncated(plain: bytes) -> bytes:
    packed = gzip.compress(plain)
    return packed[: len(packed) * 2 // 3]


def _flipped(plain: bytes) -> bytes:
    packed = bytearray(gzip.compress(plain))
    packed[-6] ^= 0xFF  # the trailer's CRC: every byte of text decodes, the check fails
    return bytes(packed)


LINES = b"".join(b'{"id": "r%d", "prompt": "say %d"}\n' % (i, i) for i in range(20000))


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("cut.jsonl.gz", _truncated(LINES), "cut short or damaged"),
        ("cut.csv.gz", _truncated(b"id,prompt\n" + LINES.replace(b'"', b"")), "cut short"),
        ("cut.jsonl.zst", compress(LINES, ".zst")[:-9], "zstd data is cut short"),
        ("flipped.jsonl.gz", _flipped(LINES), "cut short or damaged"),
        ("plain.jsonl.gz", LINES, "not gzip data"),
        ("empty.jsonl.gz", b"", r"not gzip data \(it is empty\)"),
    ],
)
def test_a_damaged_compressed_file_is_exit_65_naming_it_never_fewer_rows(
    echo_engine,  # noqa: F811
    tmp_path,
    name,
    data,
    said,
):
    src = tmp_path / name
    src.write_bytes(data)
    with pytest.raises(InputDataError, match=said):
        list(read_rows(str(src)))
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"input": {"path": str(src)}, "output": {"path": "out"}}))
    for command in ("validate", "run"):
        code, summary = cli(command, job)
        assert (code, summary["exit_code"]) == (65, 65), (command, summary)
        assert str(src) in summary["error"] and re.search(said, summary["error"])
    assert not list((tmp_path / "out").glob("results/part-*"))


def test_a_compressed_files_identity_is_its_bytes_and_its_rows_are_digested_decompressed(
    echo_engine,  # noqa: F811
    tmp_path,
):
    """The same rows compressed anew are a changed file (refused, 78) in which no row changed;
    a row changed inside it is named."""
    src = tmp_path / "in.jsonl.gz"
    rows = [{"id": f"r{i}", "prompt": f"say {i}"} for i in range(5)]
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    src.write_bytes(gzip.compress(text, compresslevel=9))
    code, summary, out = run_job(tmp_path, src)
    assert code == 0, summary
    src.write_bytes(gzip.compress(text, compresslevel=1, mtime=1))
    code, summary, _ = run_job(tmp_path, src)
    assert code == 78, summary
    assert "in.jsonl.gz: content changed" in summary["error"]
    assert "rows changed:" not in summary["error"]
    rows[3]["prompt"] = "say something else"
    src.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    code, summary, _ = run_job(tmp_path, src)
    assert code == 78, summary
    assert "rows changed: 1 ('r3')" in summary["error"]
