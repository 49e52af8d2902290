"""JSON from users' files (a safetensors header, a label file) parsed with its nesting bounded.

`json.loads` recurses once per level of nesting: `[[[[...]]]]` a hundred thousand levels deep escapes as a
RecursionError. `loads` measures the depth first, in one linear pass (string literals removed by one regex,
then the running count of the brackets left), and refuses anything deeper than the caller's limit with a
NestingError, a ValueError like json's own: a caller that refuses malformed JSON refuses this too.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

# A string literal, or an unterminated one up to the end: possessive, so the scan never backtracks.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class NestingError(ValueError):
    """JSON nested deeper than its reader allows."""


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text` (0 for a scalar), brackets inside strings not counted."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads(text: str, max_depth: int) -> Any:
    """`json.loads(text)` for text nested at most `max_depth` levels deep. Raises NestingError for deeper text,
    json.JSONDecodeError (a ValueError) for text that is not JSON."""
    depth = nesting_depth(text)
    if depth > max_depth:
        raise NestingError(f"it nests {depth:,} levels deep, more than the {max_depth} allowed")
    return json.loads(text)
