"""The LUFFY row schema (OpenR1-Math-46k-8192 and the toy world) and its validation.

A row::

    data_source : str
    prompt      : [{"role": "system", "content": str}?, {"role": "user", "content": str}]
    target      : [{"role": "assistant", "content": str}]
    ability     : str
    reward_model: {"ground_truth": str, "style": str}
    extra_info  : {"index": int, "split": str}
    behaviour_logprobs : [{"text": str, "logprob": float}]   (optional; PEAR reads it)

``behaviour_logprobs`` (:data:`common.paths.BEHAVIOUR_LOGPROBS_COLUMN`) is the target written as segments (the
teacher's tokens) whose texts concatenate to it, each with its log-probability under the policy that generated the
row; tokenisation gives each token the sum of the segments that start in it.

:func:`check_row` raises :class:`InvalidRowError` naming the source, the row index and the field; the data stage
either stops on it (``data.invalid_rows=error``) or skips the row and counts it in the manifest (``skip``).
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Any, Mapping

from common.errors import UserError
from common.paths import BEHAVIOUR_LOGPROBS_COLUMN

LUFFY_COLUMNS = ("data_source", "prompt", "target", "ability", "reward_model", "extra_info")
VERL_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
"""verl's RLHF parquet columns (docs/data.md, "Outputs"): the LUFFY row without ``target``."""
_WHITESPACE = re.compile(r"\s+")


class InvalidRowError(UserError, ValueError):
    """A training row that does not fit the LUFFY schema (or its ``data.row_format``); the message names the row index
    and the field, and an entry point prints it alone (:class:`common.errors.UserError`)."""

    def __init__(self, source: str, index: int, field: str, reason: str):
        super().__init__(f"{source}: row {index}: field '{field}' {reason}")
        self.source = source
        self.index = index
        self.field = field
        self.reason = reason


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_messages(source: str, index: int, field: str, value: Any, roles: tuple[tuple[str, ...], ...]) -> None:
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidRowError(source, index, field, f"must be a non-empty list of chat messages; got {_describe(value)}")
    for position, message in enumerate(value):
        where = f"{field}[{position}]"
        if not isinstance(message, Mapping):
            raise InvalidRowError(source, index, where, f"must be a {{role, content}} mapping; got {_describe(message)}")
        if not isinstance(message.get("role"), str):
            raise InvalidRowError(source, index, f"{where}.role", f"must be a string; got {_describe(message.get('role'))}")
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            raise InvalidRowError(source, index, f"{where}.content", f"must be a non-empty string; got {_describe(content)}")
    found = tuple(message["role"] for message in value)
    if found not in roles:
        allowed = " or ".join(str(list(r)) for r in roles)
        raise InvalidRowError(source, index, f"{field}[].role", f"must be {allowed}; got {list(found)}")


def check_row(row: Mapping[str, Any], index: int, source: str) -> None:
    """Raises :class:`InvalidRowError` unless ``row`` is a well-formed LUFFY training row."""
    for column in LUFFY_COLUMNS:
        if column not in row or row[column] is None:
            raise InvalidRowError(source, index, column, "is missing")
    for column in ("data_source", "ability"):
        if not isinstance(row[column], str):
            raise InvalidRowError(source, index, column, f"must be a string; got {_describe(row[column])}")
    _check_messages(source, index, "prompt", row["prompt"], (("system", "user"), ("user",)))
    _check_messages(source, index, "target", row["target"], (("assistant",),))
    reward = row["reward_model"]
    if not isinstance(reward, Mapping):
        raise InvalidRowError(source, index, "reward_model", f"must be a mapping; got {_describe(reward)}")
    truth = reward.get("ground_truth")
    if not isinstance(truth, str) or not truth.strip():
        raise InvalidRowError(source, index, "reward_model.ground_truth", f"must be a non-empty string; got {_describe(truth)}")
    if not isinstance(reward.get("style"), str):
        raise InvalidRowError(source, index, "reward_model.style", f"must be a string; got {_describe(reward.get('style'))}")
    extra = row["extra_info"]
    if not isinstance(extra, Mapping):
        raise InvalidRowError(source, index, "extra_info", f"must be a mapping; got {_describe(extra)}")
    if isinstance(extra.get("index"), bool) or not isinstance(extra.get("index"), int):
        raise InvalidRowError(source, index, "extra_info.index", f"must be an integer; got {_describe(extra.get('index'))}")
    if not isinstance(extra.get("split"), str):
        raise InvalidRowError(source, index, "extra_info.split", f"must be a string; got {_describe(extra.get('split'))}")
    check_behaviour_logprobs(row, index, source)


def check_behaviour_logprobs(row: Mapping[str, Any], index: int, source: str) -> None:
    """Raises :class:`InvalidRowError` unless the row's optional ``behaviour_logprobs`` is a list of
    ``{"text", "logprob"}`` segments (log-probabilities ≤ 0) whose texts concatenate to the target."""
    segments = row.get(BEHAVIOUR_LOGPROBS_COLUMN)
    if segments is None:
        return
    if not isinstance(segments, (list, tuple)) or not segments:
        raise InvalidRowError(source, index, BEHAVIOUR_LOGPROBS_COLUMN,
                              f"must be a non-empty list of {{text, logprob}} segments; got {_describe(segments)}")
    for position, segment in enumerate(segments):
        where = f"{BEHAVIOUR_LOGPROBS_COLUMN}[{position}]"
        if not isinstance(segment, Mapping) or not isinstance(segment.get("text"), str):
            raise InvalidRowError(source, index, where, f"must be a {{text, logprob}} mapping; got {_describe(segment)}")
        logprob = segment.get("logprob")
        if isinstance(logprob, bool) or not isinstance(logprob, (int, float)) or not logprob <= 0:
            raise InvalidRowError(source, index, f"{where}.logprob", f"must be a log-probability ≤ 0; got "
                                                                   f"{_describe(logprob)}")
    if "".join(segment["text"] for segment in segments) != row["target"][0]["content"]:
        raise InvalidRowError(source, index, BEHAVIOUR_LOGPROBS_COLUMN, "segments' texts must concatenate to the "
                                                                        "target's content")


def problem_text(row: Mapping[str, Any]) -> str:
    """The user turn of the prompt (the raw problem)."""
    return row["prompt"][-1]["content"]


def system_prompt(row: Mapping[str, Any]) -> str | None:
    """The system turn of the prompt, or None if the row has none."""
    first = row["prompt"][0]
    return first["content"] if first["role"] == "system" else None


def normalise_problem(text: str) -> str:
    """NFKC, lower case, whitespace runs collapsed to one space, stripped: equal for trivially different copies."""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip().lower()


def problem_key(text: str) -> str:
    """sha256 of the normalised problem text: rows with the same key are the same problem."""
    return hashlib.sha256(normalise_problem(text).encode("utf-8")).hexdigest()
