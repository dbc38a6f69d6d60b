"""CSV input never loses or mangles a row: the row reader (formats/csv.py) and the id scan
(io/ids.iter_id_batches, as input_scan uses it) cut every file into the same rows, bad rows
are row errors, and what cannot be cut into rows is refused naming the file and line. `.tsv`
and `.tab` files are CSV cut by tabs; `input.delimiter` names the separator where the file's
head would be taken otherwise."""

from __future__ import annotations

import csv
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import JobConfig
from jobrunner.errors import InputDataError
from jobrunner.formats import input_format, read_rows
from jobrunner.io.ids import iter_id_batches
from jobrunner.io.readers import RawRow, ReadOptions
from jobrunner.resume import scan_ids
from jobrunner.types import RowError
from tests.conftest import write_job


def _items(path) -> list[tuple]:
    """(kind, row, line, values or error code) of each item the row reader yields."""
    out = []
    for item in read_rows(str(path)):
        what = item.values if isinstance(item, RawRow) else item.code
        out.append((type(item).__name__, item.source.row, item.source.line, what))
    return out


def _scan(path, id_column: str | None = "id", delimiter: str | None = None) -> list[str | None]:
    """The id scan's id of each row (None: no id), in row order."""
    ids = []
    for first, batch in iter_id_batches(str(path), "csv", id_column, ReadOptions(delimiter)):
        assert first == len(ids)
        col = batch.column(0).to_pylist() if batch.num_columns else [None] * batch.num_rows
        ids += col
    return ids


def _cfg(path, **keys) -> JobConfig:
    return JobConfig.model_validate({"input": {"path": str(path), **keys}})


def _cli(*args) -> tuple[int, dict]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    lines = result.stdout.strip().splitlines()
    return result.exit_code, json.loads(lines[-1]) if lines else {}


def test_an_unterminated_quote_is_refused_naming_the_line_it_opens_on(tmp_path):
    f = tmp_path / "in.csv"
    f.write_bytes(b'id,prompt\n0,ok\n1,"unterminated\n2,ok\n3,fine\n')
    opens = f"{f}: line 3: a quoted field opens here and is never closed"
    with pytest.raises(InputDataError, match=opens):
        scan_ids(_cfg(f))
    got = []
    with pytest.raises(InputDataError, match=opens):
        got.extend(read_rows(str(f)))
    assert [g.values for g in got] == [{"id": "0", "prompt": "ok"}]  # the rows before it
    # the quote opens on the row's second line, after a closed quoted field with a newline
    f.write_bytes(b'id,prompt,x\n1,"a\nb","never closed\n2,ok,ok\n')
    with pytest.raises(InputDataError, match=f"{f}: line 3: a quoted field opens here"):
        scan_ids(_cfg(f))
    job = write_job(tmp_path / "job.yaml", "input: {path: in.csv}\noutput: {path: out}\n")
    code, summary = _cli("validate", job)
    assert code == 65 and "line 3: a quoted field opens here" in summary["error"]


def test_quoted_newlines_in_a_file_over_a_megabyte(tmp_path):
    f = tmp_path / "tickets.csv"
    with open(f, "w", newline="", encoding="utf-8") as out:
        w = csv.writer(out)
        w.writerow(["id", "prompt"])
        for i in range(40_000):
            w.writerow([str(i), f"Dear team,\nplease summarize ticket {i}.\nThanks"])
    assert f.stat().st_size > 2 << 20
    assert scan_ids(_cfg(f)) == (40_000, {})
    rows = list(read_rows(str(f)))
    assert all(isinstance(r, RawRow) for r in rows) and len(rows) == 40_000
    assert [r.source.line for r in rows[:3]] == [2, 5, 8]  # three lines a row
    assert rows[-1].source.line == 2 + 3 * 39_999
    assert rows[12345].values == {
        "id": "12345",  # digits stay a string
        "prompt": "Dear team,\nplease summarize ticket 12345.\nThanks",
    }
    job = write_job(tmp_path / "job.yaml", "input: {path: tickets.csv}\noutput: {path: out}\n")
    code, summary = _cli("validate", job)
    assert code == 0, summary
    assert summary["valid"] == 40_000


def test_the_line_is_where_the_row_starts_after_quoted_newlines(tmp_path):
    f = tmp_path / "in.csv"
    f.write_bytes(b'id,prompt\n1,"a\nb\nc"\n2,plain\n3,"x\r\ny"\n4,z\n')
    got = _items(f)
    assert [(row, line) for _, row, line, _ in got] == [(0, 2), (1, 5), (2, 6), (3, 8)]
    assert got[0][3] == {"id": "1", "prompt": "a\nb\nc"}
    assert got[2][3] == {"id": "3", "prompt": "x\r\ny"}


def test_a_ragged_row_is_a_row_error_and_its_neighbours_are_read(tmp_path):
    f = tmp_path / "in.csv"
    f.write_bytes(b"id,prompt\n1,ok\n2,a,b\n3,ok\n4\n5,ok")
    got = list(read_rows(str(f)))
    assert [g.values for g in got if isinstance(g, RawRow)] == [
        {"id": "1", "prompt": "ok"},
        {"id": "3", "prompt": "ok"},
        {"id": "5", "prompt": "ok"},
    ]
    errors = [g for g in got if isinstance(g, RowError)]
    assert [(e.code, e.source.row, e.source.line) for e in errors] == [
        ("malformed_csv", 1, 3),
        ("malformed_csv", 3, 5),
    ]
    assert errors[0].message == f"{f}:line 3: malformed CSV: expected 2 fields, got 3"
    assert errors[1].message == f"{f}:line 5: malformed CSV: expected 2 fields, got 1"
    assert _scan(f) == ["1", None, "3", None, "5"]  # a bad row has no id, as in the reader
    assert scan_ids(_cfg(f)) == (5, {})


def test_invalid_utf8_is_that_rows_error(tmp_path):
    f = tmp_path / "in.csv"
    f.write_bytes(b'id,prompt\n1,ok\n2,"caf\xe9\nau lait"\n3,\xc3\xa9t\xc3\xa9\n')
    got = list(read_rows(str(f)))
    assert [type(g).__name__ for g in got] == ["RawRow", "RowError", "RawRow"]
    bad = got[1]
    assert (bad.code, bad.field, bad.source.line) == ("invalid_utf8", "prompt", 3)
    assert bad.message == (
        f"{f}:line 3: the row is not valid UTF-8 in column 'prompt' at character 4"
    )
    assert got[2].values == {"id": "3", "prompt": "été"} and got[2].source.line == 5
    assert _scan(f) == ["1", None, "3"]


def test_a_header_that_repeats_a_name_is_refused(tmp_path):
    f = tmp_path / "in.csv"
    f.write_bytes(b"id,prompt,id,x,x\n1,ok,2,a,b\n")
    said = f"{f}: line 1: the header repeats column names: 'id' (columns 1, 3); 'x' (columns 4, 5)"
    with pytest.raises(InputDataError, match=said.replace("(", r"\(").replace(")", r"\)")):
        list(read_rows(str(f)))
    with pytest.raises(InputDataError, match="the header repeats column names"):
        scan_ids(_cfg(f))


@pytest.mark.parametrize(
    "data, rows",
    [
        (b"\xef\xbb\xbfid,prompt\n007,a\n", [(2, {"id": "007", "prompt": "a"})]),  # BOM
        (b'id,prompt\r\n1,a\r\n2,"b\r\nc"\r\n', [(2, {"id": "1", "prompt": "a"}),
                                                  (3, {"id": "2", "prompt": "b\r\nc"})]),
        (b"id,prompt\r1,a\r2,b", [(2, {"id": "1", "prompt": "a"}), (3, {"id": "2", "prompt": "b"})]),
        (b"id,prompt\n", []),  # a header alone: no rows
        (b"id,prompt", []),
        (b"", []),  # an empty file: no columns, no rows
        (b"\n\nid,prompt\n\n1,a\n\n\n2,\n\n", [(5, {"id": "1", "prompt": "a"}),
                                               (8, {"id": "2", "prompt": ""})]),
        (b"id,prompt\n1,a", [(2, {"id": "1", "prompt": "a"})]),  # no newline at the end
        (b'id,prompt,x\n1,,""\n', [(2, {"id": "1", "prompt": "", "x": ""})]),  # "" not null
    ],
    ids=["bom", "crlf", "cr", "header-only", "header-no-newline", "empty", "blank-lines",
         "no-final-newline", "empty-values"],
)  # fmt: skip
def test_odd_but_valid_files(tmp_path, data, rows):
    f = tmp_path / "in.csv"
    f.write_bytes(data)
    got = list(read_rows(str(f)))
    assert [(g.source.line, g.values) for g in got] == rows
    assert [g.source.row for g in got] == list(range(len(rows)))
    assert _scan(f) == [v["id"] for _, v in rows]
    assert scan_ids(_cfg(f)) == (len(rows), {})


@pytest.mark.parametrize(
    "data",
    [
        # Excel where the decimal mark is a comma: `;` between fields, commas inside them
        b'\xef\xbb\xbfid;text;price\r\n1;"Hallo; Welt";3,50\r\n2;"a ""b"", c";4,00\r\n',
        b'id\ttext\tprice\n1\tHallo; Welt\t3,50\n2\t"a ""b"", c"\t4,00\n',  # tab-separated
        b'"id"|"text"|"price"\n1|Hallo; Welt|3,50\n2|"a ""b"", c"|4,00\n',  # pipes, quoted names
    ],
    ids=["semicolons", "tabs", "pipes"],
)
def test_a_file_separated_by_semicolons_tabs_or_pipes_is_read_by_its_separator(tmp_path, data):
    f = tmp_path / "in.csv"
    f.write_bytes(data)
    want = [
        {"id": "1", "text": "Hallo; Welt", "price": "3,50"},
        {"id": "2", "text": 'a "b", c', "price": "4,00"},
    ]
    assert [g.values for g in read_rows(str(f))] == want
    assert [r.fields for r in _parsed_slowly(f)] == [list(w.values()) for w in want]
    assert _scan(f) == ["1", "2"]
    job = "input: {path: in.csv, prompt: {template: 'Translate: {text}'}}\noutput: {path: out}\n"
    code, summary = _cli("validate", write_job(tmp_path / "job.yaml", job))
    assert code == 0 and summary["rows"] == 2 and summary["valid"] == 2, summary


@pytest.mark.parametrize(
    "data",
    [
        b"Question; answer\nWhat is 2+2; explain\nHi there\n",
        b"prompt\tv2\nsay hi\nsay\tbye\n",
        b"prompt|answer\nA|B|C\nplain\n",
    ],
    ids=["semicolon", "tab", "pipe"],
)
def test_a_one_column_file_whose_header_holds_a_separator_stays_one_column(tmp_path, data):
    """Its rows are not cut alike by the separator: the file is one column, as before."""
    f = tmp_path / "in.csv"
    f.write_bytes(data)
    header, *rows = data.decode().splitlines()
    assert [g.values for g in read_rows(str(f))] == [{header: r} for r in rows]
    assert [r.fields for r in _parsed_slowly(f)] == [[r] for r in rows]


def test_duplicate_ids_are_placed_on_their_lines(tmp_path):
    f = tmp_path / "in.csv"
    f.write_bytes(b'id,prompt\n1,"two\nlines"\n2,x\n\n1,z\n')
    assert scan_ids(_cfg(f)) == (3, {"1": ["in.csv:line 2", "in.csv:line 6"]})


# ------------------------------------------------- .tsv files and input.delimiter

# a header with a comma in a column name: taken from the file's head, the comma would cut it
TSV = b'id\ttext, in brief\n1\tHallo, Welt\n2\t"a ""b""\tc"\n'
TSV_ROWS = [{"id": "1", "text, in brief": "Hallo, Welt"}, {"id": "2", "text, in brief": 'a "b"\tc'}]


@pytest.mark.slow
def test_a_tsv_file_is_read_by_tabs_through_validate_and_run(tmp_path):
    (tmp_path / "in.tsv").write_bytes(TSV)
    job = write_job(
        tmp_path / "job.yaml",
        "model: {dtype: float32}\ninput: {path: in.tsv, prompt: {column: 'text, in brief'}}\n"
        "generation: {max_new_tokens: 2}\noutput: {path: out, format: jsonl}\n",
    )
    code, summary = _cli("validate", job)
    assert code == 0 and (summary["rows"], summary["valid"]) == (2, 2), summary
    code, summary = _cli("run", job)
    assert code == 0 and summary["rows"]["succeeded"] == 2, summary
    shards = sorted((tmp_path / "out" / "results").iterdir())
    results = [json.loads(x) for f in shards for x in f.read_text().splitlines()]
    got = sorted((r["id"], r["text, in brief"], bool(r["completion"])) for r in results)
    assert got == [("1", "Hallo, Welt", True), ("2", 'a "b"\tc', True)]
    # the run remembers how its rows were cut: another separator is another job, not a mix
    code, summary = _cli("run", job, "--set", 'input.delimiter="\t"')
    assert code == 78 and "holds a different job" in summary["error"], summary
    assert "delimiter" in summary["error"]


def test_a_compressed_tsv_is_read_by_tabs_beside_csv_files(tmp_path):
    import gzip

    (tmp_path / "a.tsv.gz").write_bytes(gzip.compress(TSV))
    (tmp_path / "b.csv").write_bytes(b"id,text, in brief\n3,x,y\n")  # the comma cuts it
    want = [*TSV_ROWS, {"id": "3", "text": "x", " in brief": "y"}]
    assert [g.values for g in read_rows(str(tmp_path))] == want
    assert _scan(tmp_path / "a.tsv.gz") == ["1", "2"]
    assert scan_ids(_cfg(tmp_path)) == (3, {})
    assert input_format("csv").schema(str(tmp_path / "a.tsv.gz")).names == ["id", "text, in brief"]
    job = "input: {path: a.tsv.gz, prompt: {column: 'text, in brief'}}\noutput: {path: out}\n"
    code, summary = _cli("validate", write_job(tmp_path / "job.yaml", job))
    assert code == 0 and (summary["rows"], summary["valid"]) == (2, 2), summary


@pytest.mark.parametrize(
    "data, delimiter, want",
    [
        (TSV, "\t", TSV_ROWS),  # tabs, in a .csv, under a header with a comma
        # one column whose rows hold commas: no separator in the header to tell one by
        (b"prompt\nhello, world\nbye\n", "\t", [{"prompt": "hello, world"}, {"prompt": "bye"}]),
        ("id§prompt\n1§a, b\n".encode(), "§", [{"id": "1", "prompt": "a, b"}]),  # not ASCII
    ],
    ids=["tabs-under-a-comma", "one-column", "non-ascii"],
)
def test_input_delimiter_cuts_a_file_whose_head_defeats_the_guess(tmp_path, data, delimiter, want):
    from jobrunner import run_schema
    from jobrunner.executors.ray_blocks import plan_blocks, unpack_block

    f = tmp_path / "in.csv"
    f.write_bytes(data)
    guessed = [g.values if isinstance(g, RawRow) else g.code for g in read_rows(str(f))]
    assert guessed != want  # the file's head is taken otherwise
    options = ReadOptions(delimiter)
    assert [g.values for g in read_rows(str(f), options=options)] == want
    ids = [w.get("id") for w in want]
    assert _scan(f, delimiter=delimiter) == ids
    cfg = _cfg(f, delimiter=delimiter, prompt={"column": list(want[0])[-1]})
    assert scan_ids(cfg) == (len(want), {})
    assert [c.name for c in run_schema.input_fields(cfg)] == [k for k in want[0] if k != "id"]
    (block,) = plan_blocks(cfg, skip_ids=set(), block_rows=16).blocks  # the Ray driver's
    assert [r.values for r in unpack_block(block["payload"])[0]] == want
    column = list(want[0])[-1]
    job = f"input: {{path: in.csv, delimiter: {json.dumps(delimiter)}, prompt: {{column: '{column}'}}}}\n"
    code, summary = _cli("validate", write_job(tmp_path / "job.yaml", job + "output: {path: o}\n"))
    assert code == 0 and (summary["rows"], summary["valid"]) == (len(want), len(want)), summary


@pytest.mark.parametrize(
    "value, said",
    [
        ("'\\t'", 'got \\t (2 characters): for a tab, write "\\t" in double quotes'),
        ("\\t", 'got \\t (2 characters): for a tab, write "\\t" in double quotes'),
        ("tab", 'got tab (3 characters): for a tab, write "\\t" in double quotes'),
        ('";;"', "must be one character"),
        ('""', "must be one character"),
        ("'\"'", "cannot be a quote, a newline or a carriage return"),
        ("1", "must be text, got 1"),
    ],
)
def test_a_bad_input_delimiter_is_78_naming_the_key(tmp_path, value, said):
    (tmp_path / "in.csv").write_bytes(b"id,prompt\n1,a\n")
    job = write_job(
        tmp_path / "job.yaml",
        f"input:\n  path: in.csv\n  delimiter: {value}\noutput: {{path: o}}\n",
    )
    code, summary = _cli("validate", job)
    assert code == 78, summary
    assert summary["error"].startswith(f"{job}:3 input.delimiter: ") and said in summary["error"]


@pytest.mark.parametrize("named", [False, True], ids=["auto", "format-jsonl"])
def test_input_delimiter_on_a_jsonl_input_is_78(tmp_path, named):
    (tmp_path / "in.jsonl").write_text('{"id": "1", "prompt": "a;b"}\n')
    fmt = ", format: jsonl" if named else ""
    job = f"input: {{path: in.jsonl, delimiter: ';'{fmt}}}\noutput: {{path: o}}\n"
    job = write_job(tmp_path / "job.yaml", job)
    for command in ("validate", "run"):
        code, summary = _cli(command, job)
        assert code == 78, summary
        assert "input.delimiter: applies to CSV input only" in summary["error"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "name, data, written",
    [
        ("posts.tsv", b"id\ttitle\tbody\n1\tA\tfirst, one\n2\tB\tsecond\n", '"\\t"'),
        ("posts.csv", b"id;title;body\n1;A;erste, eins\n2;B;zweite\n", '";"'),
    ],
    ids=["tsv", "semicolons"],
)
def test_init_writes_the_separator_into_the_job_it_proposes(tmp_path, name, data, written):
    from jobrunner.config import load_job

    (tmp_path / name).write_bytes(data)
    code, summary = _cli("init", tmp_path / name)
    assert code == 0, summary
    job = tmp_path / "posts.yaml"
    assert f"  delimiter: {written} " in job.read_text()
    cfg = load_job(job)
    assert cfg.input.delimiter == json.loads(written)
    assert "{title}" in cfg.input.prompt.template and "{body}" in cfg.input.prompt.template
    code, summary = _cli("validate", job)
    assert code == 0 and (summary["rows"], summary["valid"]) == (2, 2), summary


# ------------------------------------------------- the two readers agree on any file

field = st.text(st.sampled_from('ab,;\t"\n\r é\x00'), max_size=6)


@st.composite
def csv_files(draw) -> bytes:
    """A header, then rows as csv.writer writes them and raw junk lines between them."""
    delimiter = draw(st.sampled_from([",", ";", "\t"]))
    width = draw(st.integers(1 if delimiter == "," else 2, 3))  # a header shows its separator
    out = io.StringIO()
    end = draw(st.sampled_from(["\n", "\r\n"]))
    w = csv.writer(out, delimiter=delimiter, lineterminator=end)
    w.writerow(["id", "p", "q"][:width])
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            w.writerow(draw(st.lists(field, min_size=1, max_size=4)))
        else:
            out.write(draw(field))
    data = out.getvalue().encode()
    if draw(st.booleans()):
        data = data.replace(b"a", b"\xff", 1)
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=csv_files(), block=st.sampled_from([1, 3, 16, 1 << 20]))
def test_the_row_reader_and_the_id_scan_agree_on_any_file(tmp_path_factory, data, block):
    """Row for row: the same count, row indices and ids (None for a row error), or the same
    refusal; at any block size, so rows and quoted fields cross block ends; and the fast path
    (pyarrow on quote-free blocks) reads as Python's csv module does."""
    import jobrunner.io.csv_rows as csv_rows

    f = tmp_path_factory.mktemp("agree") / "in.csv"
    f.write_bytes(data)
    saved = csv_rows.BLOCK_BYTES
    csv_rows.BLOCK_BYTES = block
    try:
        outcomes = []
        for read in (_items, _scan, _parsed_slowly):
            try:
                outcomes.append(read(f))
            except InputDataError as e:
                outcomes.append(str(e))
    finally:
        csv_rows.BLOCK_BYTES = saved
    items, ids, slow = outcomes
    if isinstance(items, str):
        assert items == ids == slow
        return
    assert [i[3].get("id") if i[0] == "RawRow" else None for i in items] == ids
    assert [(row, line) for _, row, line, _ in items] == [(r.row, r.line) for r in slow]
    assert [i[3] for i in items if i[0] == "RawRow"] == [
        dict(zip(_header(data), r.fields, strict=True)) for r in slow if r.problem is None
    ]
    if all(r.problem is None for r in slow):  # a well-formed file: as Python's csv reads it
        assert [r.fields for r in slow] == _python_csv(data)[1:]


def _parsed_slowly(path) -> list:
    import jobrunner.io.csv_rows as csv_rows

    return list(csv_rows.CsvRows(str(path)).parts(fast=False))


def _python_csv(data: bytes) -> list[list[str]]:
    """The rows Python's csv module reads, cut by the separator the reader takes for the file
    (which separator that is: the examples above)."""
    from jobrunner.io.csv_rows import sniff_delimiter

    lines = io.StringIO(data.decode("utf-8-sig", "surrogateescape"), newline="").readlines()
    return [r for r in csv.reader(lines, delimiter=sniff_delimiter(lines)) if r]


def _header(data: bytes) -> list[str]:
    return _python_csv(data)[0]
