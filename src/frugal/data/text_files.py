"""Your own text corpus: a `.txt` or `.jsonl` file read as documents.

`.txt`: documents are the paragraphs, separated by one or more blank lines (a file without
blank lines is one document). `.jsonl`: one JSON object per line whose `"text"` field is a
document (the layout of most fine-tuning sets; other fields are ignored, blank lines skipped).
The file is UTF-8. `frugal.data.load_documents` and `load_text` take such a path wherever they
take a bundled corpus name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from frugal.config import ConfigError

__all__ = ["TEXT_FILE_SUFFIXES", "is_text_file", "read_text_documents"]

TEXT_FILE_SUFFIXES = (".txt", ".jsonl")
"""File suffixes read as a user's text corpus."""

_BLANK_LINES = re.compile(r"\n[ \t]*\n\s*")


def is_text_file(dataset: str) -> bool:
    """Whether `dataset` names a user's text file (by its suffix) rather than a bundled corpus."""
    return Path(dataset).suffix.lower() in TEXT_FILE_SUFFIXES


def read_text_documents(path: Path) -> tuple[str, ...]:
    """The documents of a `.txt` or `.jsonl` file, in file order.

    Args:
        path: The file (suffix `.txt` or `.jsonl`).

    Returns:
        The non-empty documents.

    Raises:
        ConfigError: If the file is missing, not UTF-8, has another suffix, holds no text, or
            a `.jsonl` line is not a JSON object with a string `"text"` (the line is named).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TEXT_FILE_SUFFIXES:
        raise ConfigError(
            f"{path}: a text corpus file ends in {' or '.join(TEXT_FILE_SUFFIXES)}; rename it "
            "or convert it"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; give the path of your .txt or .jsonl") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    if suffix == ".txt":
        documents = [d.strip("\n") for d in _BLANK_LINES.split(text.replace("\r\n", "\n"))]
    else:
        documents = [_jsonl_text(line, path, number) for number, line in _lines(text)]
    documents = [d for d in documents if d.strip()]
    if not documents:
        raise ConfigError(f"{path}: holds no text; give a file with at least one document")
    return tuple(documents)


def _lines(text: str) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _jsonl_text(line: str, path: Path, number: int) -> str:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"{path}:{number}: not a JSON object ({exc})") from None
    value = record.get("text") if isinstance(record, dict) else None
    if not isinstance(value, str):
        raise ConfigError(
            f'{path}:{number}: needs a string "text" field (one document per line, e.g. '
            '{"text": "..."})'
        )
    return value
