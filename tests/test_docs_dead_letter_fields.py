"""The docs' lists of a dead letter's fields are ``beam_jax.FailedElement``'s: every list of
field names, field table, JSON example and Parquet schema of a dead letter in the pages."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import beam_jax as bj

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIELDS = {f.name for f in dataclasses.fields(bj.FailedElement)}
# Names the pages once used for fields a record does not have.
OLD = {"id", "file", "error"}
_RUN = re.compile(r"(?:`?[a-z_]+`?,\s+(?:and\s+|then\s+)?){3,}(?:and\s+)?`?[a-z_]+`?")


def _pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _field_lists(text: str) -> list[set[str]]:
    """Each comma-separated run of names in ``text`` that names three fields or more."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(line.lstrip("#/ ") for line in paragraph.splitlines())
        for run in _RUN.findall(flat):
            names = {
                w.strip("`")
                for w in re.split(r",\s+|\s+", run)
                if w.strip("`") and w not in ("and", "then")
            }
            if len(names & FIELDS) >= 3:
                found.append(names)
    return found


def test_every_list_of_a_dead_letter_s_fields_names_exactly_its_fields():
    seen = 0
    for page in _pages():
        for names in _field_lists(page.read_text()):
            seen += 1
            assert names == FIELDS, (page.name, sorted(names ^ FIELDS))
    assert seen >= 3, seen  # the pages list them: if not, this test no longer checks them


def test_the_field_table_json_examples_and_parquet_schemas_are_the_fields():
    checked = {"table": 0, "json": 0, "schema": 0}
    for page in _pages():
        text = page.read_text()
        table = re.search(r"^\| field \| type \| meaning \|\n\|[-| ]+\|\n((?:\|.*\n)+)", text, re.M)
        if table:
            names = set(re.findall(r"^\| `([a-z_]+)` \|", table[1], re.M))
            assert names == FIELDS, (page.name, sorted(names ^ FIELDS))
            checked["table"] += 1
        for example in re.findall(r'^\{"key".*?\}$', text, re.M | re.S):
            record = json.loads(example)
            assert set(record) == FIELDS, (page.name, sorted(set(record) ^ FIELDS))
            bj.FailedElement.from_dict(record)  # a record the code reads back
            checked["json"] += 1
        for schema in re.findall(r"pa\.schema\(\s*\[(.*?)\]\s*\)", text, re.S):
            names = set(re.findall(r'\("([a-z_]+)",', schema))
            if "error_type" in names:
                assert names == FIELDS, (page.name, sorted(names ^ FIELDS))
                checked["schema"] += 1
    assert all(checked.values()), checked


def test_no_page_names_the_old_convenience_fields_as_a_dead_letter_s():
    for page in _pages():
        for names in _field_lists(page.read_text()):
            assert not names & OLD, (page.name, names & OLD)
