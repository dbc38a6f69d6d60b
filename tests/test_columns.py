"""Job columns checked against the input's before any row or model: one error, a suggestion."""

from __future__ import annotations

import json
import logging

import pytest

from jobrunner.config import load_job
from jobrunner.errors import EXIT_CONFIG, ConfigError, InputDataError
from jobrunner.prep.columns import check_columns
from tests.conftest import write_job

CSV = "id,title,body\n1,A,first\n2,B,second\n"


def job(tmp_path, input_part: str, data: str = CSV, name: str = "posts.csv"):
    (tmp_path / name).write_text(data)
    return load_job(write_job(tmp_path / "job.yaml", f"input: {{path: {name}, {input_part}}}\n"))


def test_a_template_field_that_is_no_column_is_one_error_with_a_suggestion(tmp_path):
    cfg = job(tmp_path, "prompt: {template: 'Summarize {titel}: {body}'}")
    with pytest.raises(ConfigError) as e:
        check_columns(cfg)
    assert str(e.value) == (
        f"{cfg.source_file}: input.prompt.template: template field {{titel}} is not a column;"
        f" columns: id, title, body; did you mean title? (in {tmp_path / 'posts.csv'})"
    )
    assert e.value.exit_code == EXIT_CONFIG


def test_a_misspelled_id_column_is_an_error(tmp_path):
    cfg = job(tmp_path, "id_column: idd, prompt: {column: body}")
    with pytest.raises(ConfigError, match=r"input.id_column: the id column 'idd' is not a column"):
        check_columns(cfg)


def test_the_default_id_column_may_be_absent_and_says_so(tmp_path, caplog):
    cfg = job(tmp_path, "prompt: {column: body}", data="title,body\nA,first\n")
    with caplog.at_level(logging.INFO):
        check_columns(cfg)
    assert "row ids are derived" in caplog.text


def test_null_id_column_means_derived_ids_without_a_word(tmp_path, caplog):
    cfg = job(tmp_path, "id_column: null, prompt: {column: body}", data="title,body\nA,x\n")
    with caplog.at_level(logging.INFO):
        check_columns(cfg)
    assert "derived" not in caplog.text


def test_every_missing_column_is_named_at_once(tmp_path):
    cfg = job(tmp_path, "prompt: {messages_column: msgs}, priority_column: prio")
    with pytest.raises(ConfigError) as e:
        check_columns(cfg)
    lines = str(e.value).splitlines()
    assert len(lines) == 2
    assert "input.prompt.messages_column: the messages column 'msgs'" in lines[0]
    assert "input.priority_column: the priority column 'prio'" in lines[1]


def test_jsonl_columns_are_the_keys_of_the_first_lines(tmp_path):
    rows = [{"id": "a", "text": "x"}, {"id": "b", "question": "y"}]
    data = "".join(json.dumps(r) + "\n" for r in rows)
    check_columns(job(tmp_path, "prompt: {column: question}", data, "rows.jsonl"))
    with pytest.raises(ConfigError, match="did you mean question"):
        check_columns(job(tmp_path, "prompt: {column: questoin}", data, "rows.jsonl"))


def test_missing_input_says_what_it_resolved_against(tmp_path):
    cfg = load_job(write_job(tmp_path / "job.yaml", "input: {path: data/nope.parquet}\n"))
    with pytest.raises(InputDataError) as e:
        check_columns(cfg)
    assert str(tmp_path / "data" / "nope.parquet") in str(e.value)
    assert f"relative to the job file's folder, {tmp_path}" in str(e.value)


def test_a_named_id_column_must_be_in_every_file(tmp_path):
    """A file without the id column the job names would derive its ids: still refused, even
    where other files have it (a template column some files lack is not: its rows fail)."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.csv").write_text("key,body\n1,x\n")
    (tmp_path / "d" / "b.csv").write_text("body\ny\n")
    cfg = load_job(
        write_job(
            tmp_path / "job.yaml", "input: {path: d, id_column: key, prompt: {column: body}}\n"
        )
    )
    with pytest.raises(ConfigError, match=r"the id column 'key' is not a column.*\(in .*b\.csv\)"):
        check_columns(cfg)
