"""Readers stream rows from Parquet, JSONL and CSV; bad lines become per-row errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobrunner.errors import InputDataError
from jobrunner.formats import input_files, read_rows
from jobrunner.io.readers import RawRow
from jobrunner.types import RowError


def test_parquet_streams_every_row_with_its_index(tmp_path):
    rows = [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(10)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet", row_group_size=3)
    got = list(read_rows(str(tmp_path / "a.parquet"), batch_rows=4))
    assert [g.values for g in got] == rows
    assert [g.source.row for g in got] == list(range(10))


def test_jsonl_bad_lines_are_errors_and_neighbours_survive(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_bytes(
        b'{"id": "a", "prompt": "x"}\n{not json\n\n[1, 2]\n{"id": "b", "prompt": "\xff\xfe"}\n'
        b'{"id": "c", "prompt": "z"}\n'
    )
    got = list(read_rows(str(f)))
    assert [type(g).__name__ for g in got] == [
        "RawRow",
        "RowError",
        "RowError",
        "RowError",
        "RawRow",
    ]
    assert [g.code for g in got if isinstance(g, RowError)] == [
        "malformed_json",
        "not_an_object",
        "invalid_utf8",
    ]
    assert [g.source.line for g in got] == [1, 2, 4, 5, 6]
    assert got[-1].values == {"id": "c", "prompt": "z"}


@pytest.mark.parametrize("indent", [2, None])  # an array over many lines, or on one
def test_a_json_array_file_is_refused_with_how_to_make_it_json_lines(tmp_path, indent):
    rows = [{"id": f"a{i}", "prompt": f"p{i}"} for i in range(3)]
    (tmp_path / "data.json").write_text(json.dumps(rows, indent=indent))
    with pytest.raises(InputDataError, match=r"data.json: holds a JSON array, not JSON Lines") as e:
        list(read_rows(str(tmp_path / "data.json")))
    assert "jq -c '.[]' data.json > data.jsonl" in str(e.value)


def test_an_array_row_among_rows_stays_that_rows_error(tmp_path):
    (tmp_path / "in.jsonl").write_text('[1, 2]\n{"id": "a", "prompt": "p"}\n')
    bad, good = read_rows(str(tmp_path / "in.jsonl"))
    assert isinstance(bad, RowError) and bad.code == "not_an_object"
    assert isinstance(good, RawRow) and good.values["id"] == "a"


def test_csv_keeps_strings_and_line_numbers(tmp_path):
    f = tmp_path / "in.csv"
    f.write_text('id,prompt\n007,"hello, world"\n8,bye\n')
    got = list(read_rows(str(f)))
    assert [g.values for g in got] == [
        {"id": "007", "prompt": "hello, world"},
        {"id": "8", "prompt": "bye"},
    ]
    assert [g.source.line for g in got] == [2, 3]


def test_directory_and_glob_in_stable_order(tmp_path):
    for name in ("b.jsonl", "a.jsonl"):
        (tmp_path / name).write_text(json.dumps({"prompt": name}) + "\n")
    (tmp_path / "notes.txt").write_text("ignored")
    assert [p.rsplit("/", 1)[1] for p in input_files(str(tmp_path))] == ["a.jsonl", "b.jsonl"]
    assert len(input_files(str(tmp_path / "*.jsonl"))) == 2
    with pytest.raises(InputDataError, match="no input files"):
        input_files(str(tmp_path / "*.parquet"))


def test_a_directory_reads_any_case_of_suffix_and_names_what_it_leaves(tmp_path, caplog):
    import gzip

    (tmp_path / "x.jsonl").write_text(json.dumps({"prompt": "x"}) + "\n")
    (tmp_path / "UPPER.JSONL").write_text(json.dumps({"prompt": "upper"}) + "\n")
    (tmp_path / "comp.jsonl.gz").write_bytes(gzip.compress(b'{"prompt": "packed"}\n'))
    (tmp_path / "comp.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    (tmp_path / "notes.txt").write_text("not data")
    files = [p.rsplit("/", 1)[1] for p in input_files(str(tmp_path))]
    assert files == ["UPPER.JSONL", "comp.jsonl.gz", "x.jsonl"]
    prompts = sorted(r.values["prompt"] for r in read_rows(str(tmp_path)))
    assert prompts == ["packed", "upper", "x"]
    said = caplog.text
    assert "2 files of no input format are not read (comp.parquet.gz, notes.txt)" in said
    assert "compressed as input.path does not read (.parquet.gz)" in said


def test_samples_exist_with_a_length_spread():
    from tests.conftest import SAMPLES

    rows = [r for r in read_rows(str(SAMPLES / "prompts.parquet")) if isinstance(r, RawRow)]
    assert len(rows) >= 200
    lengths = sorted(len(r.values["prompt"]) for r in rows)
    assert lengths[0] < 200 and lengths[-1] > 6000  # chars: short questions to >1,000 tokens


def test_auto_format_recognises_an_openai_batch_file(tmp_path):
    from jobrunner.formats import resolve_format

    batch = tmp_path / "requests.jsonl"
    batch.write_text(
        json.dumps(
            {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "hi"}}
        )
        + "\n"
    )
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"id": "a", "prompt": "hi", "body": "x"}) + "\n")
    assert resolve_format(str(batch), "auto") == "openai-batch"
    assert resolve_format(str(plain), "auto") == "jsonl"
    assert resolve_format(str(batch), "jsonl") == "jsonl"  # an explicit format wins
