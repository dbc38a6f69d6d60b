"""A CSV file as rows: its header, then each row's fields, physical line and problem, if any.

Python's csv module parses (RFC 4180 quoting; a quoted field may hold newlines). The bytes are
read in blocks of whole lines, so each row's 1-based starting line is known, and a bad row is
that row's problem, not the file's: more or fewer fields than the header (`malformed_csv`), or
bytes that are not UTF-8 (`invalid_utf8`; kept by `surrogateescape`, so they never shift a
field). Empty lines are not rows (as for Python's DictReader and pyarrow). What cannot be cut
into rows is the file's error (InputDataError): a header that repeats a name or is not UTF-8,
a quote opened and never closed, a field past MAX_FIELD_CHARS. An empty file has no rows.
A compressed file's text is read as it is decompressed (io/compressed.py).

The separator (`file_delimiter`) is the job's `input.delimiter` where it names one; else a tab
for a `.tsv` or `.tab` file (compressed too: `.tsv.gz`), by its suffix alone; else the
header's (`sniff_delimiter`): a comma when the header holds one outside quotes, else whichever
of `;` (Excel's CSV where the decimal mark is a comma), tab and `|` it holds most, where the
file's first rows agree (each cut into as many fields as the header); else a comma (a
one-column file whose header holds a `;` stays one column). Every row of the file is cut by it.

The fast path: a block after the header, valid UTF-8, that pyarrow reads into as many rows as
it has lines, the last line's quotes closed, has each row on one line; there pyarrow cuts the
rows where the csv module does, and its quoting rules give the same strings (a doubled quote
is one, a quote inside an unquoted field is kept, text after a closing quote is appended;
where they part, `"x" ,y`, pyarrow refuses the block). Such a block is read vectorized (a
`Block`); any other block is parsed here. tests/test_csv_input.py checks that both paths give
the same rows at any block size. The row reader and the id scan both read through
`CsvRows.parts`: they agree on every file.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from jobrunner.errors import InputDataError
from jobrunner.io.compressed import data_suffix, open_input

BOM = b"\xef\xbb\xbf"
BLOCK_BYTES = 1 << 20  # bytes read at once; a block is cut after its last line end
PLAIN_BLOCK_BYTES = 1 << 18  # pyarrow parses a block in pieces this size, in threads
MAX_FIELD_CHARS = 1 << 26  # a field past this is an unclosed quote, not a prompt
_ESCAPED = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8 (surrogateescape)
_BREAK = re.compile(r"\r\n?|\n")
_QUOTED = re.compile(r'"[^"]*"?')
OTHER_DELIMITERS = ";\t|"  # a header without a comma outside quotes is cut by one of these
SNIFF_ROWS = 50  # the rows after the header that must agree with another separator
SNIFF_BYTES = 1 << 16  # the file's head the separator is told from
SUFFIX_DELIMITERS = {".tsv": "\t", ".tab": "\t"}  # files whose suffix says their separator


class Row(NamedTuple):
    row: int  # 0-based row index: the header and empty lines are not rows
    line: int  # 1-based physical line the row starts on
    fields: list[str]
    problem: tuple[str, str, str | None] | None  # (code, message, column) of a bad row


class Block(NamedTuple):
    """Rows read by pyarrow: row `row + i` is the table's row i, on line `line + i`."""

    row: int
    line: int
    table: Any  # pyarrow.Table of the columns asked for, every one a string column


class CsvRows:
    """One CSV file read front to back; `header` is known once the first part is out.
    `delimiter`: the job's input.delimiter (None: the file's, file_delimiter)."""

    def __init__(self, file: str, delimiter: str | None = None) -> None:
        self.file = file
        self.header: list[str] | None = None
        self.chosen = delimiter
        self.delimiter = ","  # file_delimiter's, once the file is opened
        self.line = 1  # the physical line the next block starts on
        self.row = 0  # the index the next row gets

    def parts(self, columns: list[str] | None = None, fast: bool = True) -> Iterator[Row | Block]:
        """The rows in order: each a Row, or many in a Block (the fast path, module doc) that
        holds the `columns` the header has (None: all of them)."""
        csv.field_size_limit(max(csv.field_size_limit(), MAX_FIELD_CHARS))
        try:
            self.delimiter = file_delimiter(self.file, self.chosen)
            f = open_input(self.file)
        except OSError as e:
            raise InputDataError(f"{self.file}: not a readable CSV file: {e}") from e
        pending, need = b"", 0  # the lines of a row whose quoted field runs past the blocks
        try:
            with f:
                for data, last in _blocks(f):
                    pending += data
                    if not last and len(pending) < need:
                        continue  # a long row is parsed again only once its data doubled
                    data, pending = pending, b""
                    block = self._plain_block(data, columns) if fast else None
                    if block is not None:
                        yield block
                        continue
                    pending = yield from self._parse(data, last)
                    need = 2 * len(pending)
        except OSError as e:
            raise InputDataError(
                f"{self.file}: unreadable after line {self.line} ({e}); the lines before it"
                " are read. Repair the file and run again"
            ) from e

    def _plain_block(self, data: bytes, columns: list[str] | None) -> Block | None:
        if self.header is None or not _fast_delimiter(self.delimiter) or not _is_utf8(data):
            return None
        names = self.header if columns is None else [c for c in columns if c in self.header]
        quoted = b'"' in data
        table = read_plain(data, self.header, names, quoted, self.delimiter)
        if table is None or table.num_rows != _count_lines(data):
            return None  # refused (a ragged row), or lines that are not one row each
        if quoted and not _closes(_last_line(data), self.delimiter):
            return None  # the last row's quoted field runs on into the next block
        block = Block(self.row, self.line, table)
        self.row += table.num_rows
        self.line += table.num_rows
        return block

    def _parse(self, data: bytes, last: bool) -> Iterator[Row]:
        """The rows of `data` (whole lines from a row boundary); returns the lines of a row
        the block's end cuts off, to be parsed again with the next block."""
        lines, escaped = self._lines(data)
        done: list[bool] = []
        reader = csv.reader(_until_end(lines, done), delimiter=self.delimiter, strict=False)
        width = len(self.header) if self.header is not None else 0
        used = 0  # the lines the rows so far took
        try:
            for fields in reader:
                start = self.line + used
                if done:  # the data ended inside a quoted field
                    if last:
                        raise self._unclosed(start, fields)
                    return "".join(lines[used:]).encode("utf-8", "surrogateescape")
                used = reader.line_num
                if not fields:
                    continue  # an empty line
                if self.header is None:
                    self.header = self._check_header(fields, start, escaped)
                    width = len(fields)
                    continue
                bad = escaped or len(fields) != width
                yield Row(self.row, start, fields, _problem(self.header, fields) if bad else None)
                self.row += 1
        except csv.Error as e:  # a field past MAX_FIELD_CHARS: no row boundary to go on from
            raise InputDataError(
                f"{self.file}: line {self.line + used}: the row starting here is not readable"
                f" CSV ({e}); most likely a quoted field is never closed (a quote inside a"
                ' quoted field is written twice: ""). Repair the file and run again'
            ) from e
        finally:
            self.line += used
        return b""

    def _lines(self, data: bytes) -> tuple[list[str], bool]:
        """`data` as lines, each with its line end; True when bytes that are not UTF-8 were
        kept as lone surrogates."""
        if self.line == 1 and data.startswith(BOM):
            data = data[len(BOM) :]
        try:
            text, escaped = data.decode("utf-8"), False
        except UnicodeDecodeError:
            text, escaped = data.decode("utf-8", "surrogateescape"), True
        return io.StringIO(text, newline="").readlines(), escaped

    def _check_header(self, names: list[str], line: int, escaped: bool) -> list[str]:
        where = f"{self.file}: line {line}"
        if escaped and any(_ESCAPED.search(n) for n in names):
            raise InputDataError(
                f"{where}: the header is not valid UTF-8; save the file as UTF-8 and run again"
            )
        seen: dict[str, list[str]] = {}
        for k, name in enumerate(names, 1):
            seen.setdefault(name, []).append(str(k))
        repeats = [f"{n!r} (columns {', '.join(ks)})" for n, ks in seen.items() if len(ks) > 1]
        if repeats:
            raise InputDataError(
                f"{where}: the header repeats column names: {'; '.join(repeats)}; only one of"
                " each could be read. Give each column its own name and run again"
            )
        return names

    def _unclosed(self, start: int, fields: list[str]) -> InputDataError:
        opens = start + len(_BREAK.findall(self.delimiter.join(fields[:-1])))
        return InputDataError(
            f"{self.file}: line {opens}: a quoted field opens here and is never closed (the file"
            f" ends inside it), so no row from line {start} on can be read; the rows before it"
            ' are read. Close the quote (a quote inside a quoted field is written twice: "")'
            " and run again"
        )


def file_delimiter(file: str, chosen: str | None = None) -> str:
    """The separator `file` is cut by: `chosen` (input.delimiter), else its suffix's, else its
    header's (module doc)."""
    if chosen is not None:
        return chosen
    return SUFFIX_DELIMITERS.get(data_suffix(file)) or _sniff(file)


def _sniff(file: str) -> str:
    """The file's separator, from its first SNIFF_BYTES (whatever the blocks' size)."""
    with open_input(file) as f:
        head = f.read(SNIFF_BYTES)
        whole = len(head) < SNIFF_BYTES
    if not whole:  # whole lines only
        head = head[: max(head.rfind(b"\n"), head.rfind(b"\r")) + 1]
    text = head.removeprefix(BOM).decode("utf-8", "surrogateescape")
    return sniff_delimiter(io.StringIO(text, newline="").readlines())


def sniff_delimiter(lines: list[str]) -> str:
    """The separator of a file whose first lines are `lines` (module doc)."""
    header = next((x for x in lines if x.strip()), "")
    outside = _QUOTED.sub("", header)
    if "," in outside:
        return ","
    for d in sorted(OTHER_DELIMITERS, key=outside.count, reverse=True):
        if outside.count(d) and _rows_agree(lines, d):
            return d
    return ","


def _rows_agree(lines: list[str], delimiter: str) -> bool:
    """Whether the header and the rows after it (SNIFF_ROWS of them, or as many as `lines`
    hold) are cut by `delimiter` into the same number of fields."""
    rows = (r for r in csv.reader(lines, delimiter=delimiter, strict=False) if r)
    sample = list(itertools.islice(rows, SNIFF_ROWS + 1))
    return all(len(r) == len(sample[0]) for r in sample)


def read_plain(
    data: bytes, header: list[str], columns: list[str], quoted: bool, delimiter: str = ","
) -> Any:
    """A block of valid UTF-8 read by pyarrow: a Table of `columns`, every value a string
    ("" when empty); None where pyarrow refuses it."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    opts = pcsv.ReadOptions(column_names=header, block_size=PLAIN_BLOCK_BYTES)
    # quoted: cut its pieces by quotes
    parse = pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=quoted)
    convert = pcsv.ConvertOptions(
        column_types={n: pa.string() for n in header},
        strings_can_be_null=False,
        include_columns=columns,
    )
    try:
        buf = pa.py_buffer(data)
        table = pcsv.read_csv(buf, read_options=opts, parse_options=parse, convert_options=convert)
    except pa.ArrowInvalid:  # a row of another width than the header's
        return None
    return table if columns else table.select([])  # none asked: pyarrow reads them all


def _until_end(lines: list[str], done: list[bool]) -> Iterator[str]:
    """`lines`, then a mark in `done`: a row that comes out after the mark ran off the end."""
    yield from lines
    done.append(True)


def _problem(header: list[str], fields: list[str]) -> tuple[str, str, str | None] | None:
    if len(fields) != len(header):
        got = len(fields)
        return "malformed_csv", f"malformed CSV: expected {len(header)} fields, got {got}", None
    for name, value in zip(header, fields, strict=True):
        if m := _ESCAPED.search(value):
            where = f"in column {name!r} at character {m.start() + 1}"
            return "invalid_utf8", f"the row is not valid UTF-8 {where}", name
    return None


def _closes(line: bytes, delimiter: str) -> bool:
    """Whether a line read alone ends outside a quoted field."""
    done: list[bool] = []
    lines = _until_end([line.decode("utf-8")], done)
    next(csv.reader(lines, delimiter=delimiter, strict=False), None)
    return not done


def _last_line(data: bytes) -> bytes:
    body = data.removesuffix(b"\n").removesuffix(b"\r")
    return body[max(body.rfind(b"\n"), body.rfind(b"\r")) + 1 :]


def _fast_delimiter(delimiter: str) -> bool:
    """pyarrow takes one ASCII byte, not NUL, as a separator; the csv module takes any."""
    return delimiter.isascii() and delimiter != "\0"


def _is_utf8(data: bytes) -> bool:
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _count_lines(data: bytes) -> int:
    """Lines in `data`: line ends (\n, \r\n or a lone \r, as the csv module's lines end),
    and a last line without one."""
    ends = data.count(b"\n")
    if b"\r" in data:
        ends += data.count(b"\r") - data.count(b"\r\n")
    return ends + (bool(data) and not data.endswith((b"\n", b"\r")))


def _blocks(f) -> Iterator[tuple[bytes, bool]]:
    """The file in blocks of whole lines, True with the last (which may lack its line end)."""
    rest = b""
    while chunk := f.read(BLOCK_BYTES):
        data = rest + chunk
        cut = data.rfind(b"\n") + 1 or data.rfind(b"\r", 0, len(data) - 1) + 1
        if cut:  # a lone \r is cut at only where the next byte shows it is not \r\n
            yield data[:cut], False
        rest = data[cut:]
    yield rest, True
