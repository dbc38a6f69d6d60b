"""docs/DESIGN.md documents every job-file key (the key reference a user reads)."""

from __future__ import annotations

import re
from pathlib import Path

from jobrunner.config import key_paths

DESIGN = Path(__file__).resolve().parent.parent / "docs" / "DESIGN.md"


def documented_keys() -> set[str]:
    """Keys in the reference tables: rows that start with a backquoted key path."""
    return set(re.findall(r"^\| `([a-z0-9_.]+)` \|", DESIGN.read_text(), flags=re.M))


def test_every_job_key_is_documented():
    sections = {k.rsplit(".", 1)[0] for k in key_paths() if "." in k}
    leaves = {k for k in key_paths() if k not in sections or k == "input.prompt"}
    missing = sorted(leaves - documented_keys())
    assert not missing, f"docs/DESIGN.md section 4 lacks these JobConfig keys: {missing}"


def test_no_documented_key_is_gone():
    gone = sorted(documented_keys() - set(key_paths()))
    assert not gone, f"docs/DESIGN.md documents keys JobConfig no longer has: {gone}"


def test_key_paths_cover_nested_sections():
    keys = key_paths()
    assert "input.prompt.template" in keys and "ray.block_rows" in keys
    assert "source_file" not in keys
