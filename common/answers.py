"""The answer format every stage reads: the content of the last complete ``\\boxed{…}`` of a text.

One extractor for the evaluation scorer (``eval/scoring.py``, hence the RL reward) and the toy base model's health
checks (``toy/``), so a toy model's greedy accuracy counts the answer the evaluation would judge.
"""
from __future__ import annotations

import re

_BOX_OR_BRACE = re.compile(r"(?P<box>\\boxed *\{)|\\[{}]|(?P<open>\{)|(?P<close>\})")
"""A box opening (``\\boxed{``, spaces allowed before the brace), an escaped brace (not counted), or a brace."""


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{…}`` (the one that opens last; braces balanced, ``\\{``/``\\}`` not
    counted), or None.

    One pass over the braces with a stack of the open ones, so the cost is linear in ``len(text)`` even for boxes
    nested thousands deep. A box that never closes hides the boxes that open after it (they lie inside it); an
    unclosed trailing box (truncated output) is skipped, so an earlier complete box counts.
    """
    open_braces: list[int] = []  # per open brace: where its box's content starts, or -1 if it opens no box
    closed: list[tuple[int, int]] = []  # (content start, content end) of each complete box
    for match in _BOX_OR_BRACE.finditer(text):
        if match.lastgroup == "box":
            open_braces.append(match.end())
        elif match.lastgroup == "open":
            open_braces.append(-1)
        elif match.lastgroup == "close" and open_braces:
            start = open_braces.pop()
            if start >= 0:
                closed.append((start, match.start()))
    first_unclosed = next((start for start in open_braces if start >= 0), len(text) + 1)
    last = max((box for box in closed if box[0] < first_unclosed), default=None)
    return text[last[0]:last[1]] if last else None
