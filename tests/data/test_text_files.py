"""Your own text corpus: .txt paragraphs and .jsonl records, and the errors of bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frugal.config import ConfigError
from frugal.data import load_documents, load_text
from frugal.data.text_files import is_text_file, read_text_documents


def test_txt_paragraphs_are_documents(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("first line\nstill first\n\n\nsecond\r\n  \r\nthird\n", encoding="utf-8")
    assert read_text_documents(path) == ("first line\nstill first", "second", "third")
    assert load_documents(str(path)) == read_text_documents(path)
    assert load_text(str(path)) == "first line\nstill first\nsecond\nthird"
    one = tmp_path / "one.TXT"
    one.write_text("no blank line\nat all")
    assert read_text_documents(one) == ("no blank line\nat all",)


def test_jsonl_text_fields_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    rows = [{"text": "héllo", "label": 1}, {"text": "wörld\n\nwith a blank line"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert read_text_documents(path) == ("héllo", "wörld\n\nwith a blank line")
    assert is_text_file(str(path)) and not is_text_file("fortunes")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("a.jsonl", '{"text": "ok"}\nnot json\n', r"a.jsonl:2: not a JSON object"),
        ("b.jsonl", '{"text": "ok"}\n\n{"body": "x"}\n', r"b.jsonl:3: needs a string \"text\""),
        ("c.jsonl", '["text"]\n', r"c.jsonl:1: needs a string \"text\""),
        ("d.txt", "\n \n\n", r"d.txt: holds no text; give a file with at least one document"),
        ("e.csv", "a,b\n", r"e.csv: a text corpus file ends in .txt or .jsonl"),
    ],
)
def test_bad_files_name_the_line_and_the_fix(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        read_text_documents(path)


def test_missing_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope.txt: no such file; give the path of your"):
        load_documents(str(tmp_path / "nope.txt"))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin.txt: not UTF-8 text \(unexpected end of data"):
        read_text_documents(latin)
