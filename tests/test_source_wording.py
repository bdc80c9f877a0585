"""The library's comments and docstrings quote no timings of one machine: figures live in
``benchmarks/`` and docs/benchmarks.md, measured in one run with the machine recorded."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

import fastdata

PACKAGE = Path(fastdata.__file__).parent
# "4.3 ms", "about 3x the time", "2.5x faster", "1,800 images/s"
TIMING = re.compile(
    r"\d+(\.\d+)?\s?(ms|µs|us|ns)\b"
    r"|\d+(\.\d+)?\s?[x×]\s+(the\s+time|faster|slower|as\s+fast)"
    r"|\d[\d,.]*\s?(img|images|samples|batches)/s\b",
    re.IGNORECASE,
)


def prose(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and string literal that stands as a statement
    (docstrings), not the strings code uses (messages, column headers)."""
    found = []
    previous = tokenize.NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        statement = previous in (tokenize.NEWLINE, tokenize.INDENT)
        if token.type == tokenize.COMMENT or (token.type == tokenize.STRING and statement):
            found.append((token.start[0], token.string))
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            previous = token.type
    return found


def test_no_comment_or_docstring_quotes_a_timing() -> None:
    quoted = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {match.group(0)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in prose(path.read_text())
        for match in TIMING.finditer(text)
    ]
    assert not quoted, "timings belong in benchmarks/ and docs/benchmarks.md: " + str(quoted)


@pytest.mark.parametrize(
    ("source", "quotes"),
    [
        ('"""Fast: about 3x the\n    time of OpenCV."""\n', True),
        ("x = 1  # 4.5 ms per image here\n", True),
        ('def f():\n    """Reads 1,800 images/s."""\n', True),
        ('print(f"{rate:.0f} images/s")\n', False),
        ('HEADER = ("wait ms", "memory")\n', False),
        ("x = 1  # a 2x shrink is area-averaged\n", False),
    ],
)
def test_what_counts_as_a_quoted_timing(source: str, quotes: bool) -> None:
    assert any(TIMING.search(text) for _, text in prose(source)) is quotes
