"""CSV input never loses or mangles a row: the row reader (formats/csv.py) and the id scan
(io/ids.iter_id_batches, as input_scan uses it) cut every file into the same rows, bad rows
are row errors, and what cannot be cut into rows is refused naming the file and line."""

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
from jobrunner.formats import read_rows
from jobrunner.io.ids import iter_id_batches
from jobrunner.io.readers import RawRow
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


def _scan(path, id_column: str | None = "id") -> list[str | None]:
    """The id scan's id of each row (None: no id), in row order."""
    ids = []
    for first, batch in iter_id_batches(str(path), "csv", id_column):
        assert first == len(ids)
        col = batch.column(0).to_pylist() if batch.num_columns else [None] * batch.num_rows
        ids += col
    return ids


def _cfg(path) -> JobConfig:
    return JobConfig.model_validate({"input": {"path": str(path)}})


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
