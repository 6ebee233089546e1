"""MkDocs hook: keep `mkdocs build --strict` strict for everything but index notation.

A few docstrings in src/frugal write tensor or mesh indexing in plain text, e.g.
`mesh[j][i] = rank running stage i of pipeline j` or `bytes[step][stage]`. Markdown reads
`[j][i]` as a reference-style link, and mkdocs-autorefs then warns that it cannot find the
target `i`. Those are not broken links, so this hook demotes exactly those warnings (the
targets listed in INDEX_TARGETS, raised from a docstring under src/frugal/) to INFO. Every
other unresolved cross-reference still fails the strict build. Writing the index expressions
in backticks in the docstrings would make this hook unnecessary.
"""

from __future__ import annotations

import logging
import re
from typing import Any

INDEX_TARGETS = frozenset({"i", "j", "k", "step", "stage"})
_UNRESOLVED = re.compile(
    r"from \S*src/frugal/\S+: .*Could not find cross-reference target '([^']+)'$"
)
_LOGGER = "mkdocs.plugins.mkdocs_autorefs._internal.plugin"


class _IndexNotationFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        match = _UNRESOLVED.search(record.getMessage())
        if record.levelno == logging.WARNING and match and match.group(1) in INDEX_TARGETS:
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def on_startup(**kwargs: Any) -> None:
    """Install the filter once per MkDocs process."""
    logger = logging.getLogger(_LOGGER)
    if not any(isinstance(f, _IndexNotationFilter) for f in logger.filters):
        logger.addFilter(_IndexNotationFilter())
