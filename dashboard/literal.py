"""Text shown as written: a file name, a class name from an uploaded label file or an error that quotes one, escaped
for Streamlit's Markdown (`markdown_literal`) or for matplotlib's mathtext (`mathtext_literal`). No Streamlit here."""

from __future__ import annotations

# What Markdown (CommonMark + GitHub's extensions) and Streamlit's own syntax could turn into markup:
# emphasis, code, links and images, HTML and autolinks, $math$, strikethrough, tables, :emoji: and
# :colour[...] directives, "http://" autolinks. Plain punctuation of file names (., _, -) stays as it is.
_MARKDOWN_SPECIAL = frozenset("\\`*[]<>$~|:")


def markdown_literal(text: str) -> str:
    """`text` (a file name, an error that quotes one) shown as written in Streamlit Markdown: each
    character that could start markup is backslash-escaped, and line breaks become spaces."""
    flat = " ".join(text.splitlines())
    return "".join("\\" + ch if ch in _MARKDOWN_SPECIAL else ch for ch in flat)


def mathtext_literal(text: str) -> str:
    """`text` (a class name from an uploaded label file, an image name) for a matplotlib title or label:
    a `$` would start mathtext, and malformed mathtext makes the figure raise; escaped, it is a dollar sign."""
    return text.replace("$", r"\$")
