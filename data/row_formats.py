"""Training rows in the common chat and instruction formats, converted to the LUFFY schema (``data.row_format``).

``chat``, one exchange per row, in either spelling::

    {"messages": [{"role": "system", "content": ...}?, {"role": "user", ...}, {"role": "assistant", ...}]}   # OpenAI
    {"conversations": [{"from": "system", "value": ...}?, {"from": "human", ...}, {"from": "gpt", ...}]}    # ShareGPT

``alpaca``::

    {"instruction": str, "input": str (optional, may be empty), "output": str, "system": str (optional)}

Either may carry ``answer``: the ground truth of the RL reward. Without it the ground truth is the content of the
response's last ``\\boxed{...}`` (:func:`common.answers.last_boxed`, what the evaluation judges); a row with
neither is invalid. The LUFFY row (:mod:`data.schema`) gets ``prompt`` = [system?, user], ``target`` = [assistant],
``data_source`` = the row's own or the format's name, ``ability`` = ``math`` (the reward judges a boxed answer),
``reward_model`` = {ground_truth, style: rule} and ``extra_info`` = {index: the row's index, split: train}.
A field that is missing or empty raises :class:`data.schema.InvalidRowError` naming the row and the field.
"""
from __future__ import annotations

from typing import Any, Mapping

from common.answers import last_boxed
from data.schema import InvalidRowError

SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
"""ShareGPT's ``from`` values and the chat role each one is."""


def _text(mapping: Mapping[str, Any], key: str, index: int, source: str, *, required: bool = True,
          where: str = "") -> str:
    """``mapping[key]``, a string (``where``: the mapping's place in the row, for the error's field name)."""
    value, field = mapping.get(key), f"{where}.{key}" if where else key
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise InvalidRowError(source, index, field, "is missing" if value is None else "is empty")
        return ""
    if not isinstance(value, str):
        raise InvalidRowError(source, index, field, f"must be a string; got {type(value).__name__}")
    return value


def chat_turns(row: Mapping[str, Any], index: int, source: str) -> list[dict[str, str]]:
    """The row's turns as ``{role, content}``, from ``messages`` (OpenAI) or ``conversations`` (ShareGPT)."""
    field, role_key, content_key = ("messages", "role", "content") if row.get("messages") is not None else (
        "conversations", "from", "value")
    turns = row.get(field)
    if turns is None:
        raise InvalidRowError(source, index, "messages", "is missing (a chat row has messages: [{role, content}] or "
                                                         "ShareGPT conversations: [{from, value}])")
    if not isinstance(turns, list) or not turns:
        raise InvalidRowError(source, index, field, "must be a non-empty list of turns")
    converted = []
    for position, turn in enumerate(turns):
        where = f"{field}[{position}]"
        if not isinstance(turn, Mapping):
            raise InvalidRowError(source, index, where, f"must be a {{{role_key}, {content_key}}} mapping")
        role = SHAREGPT_ROLES.get(_text(turn, role_key, index, source, where=where))
        if role is None:
            raise InvalidRowError(source, index, f"{where}.{role_key}",
                                  f"must be one of {sorted(SHAREGPT_ROLES)}; got {turn[role_key]!r}")
        converted.append({"role": role, "content": _text(turn, content_key, index, source, where=where)})
    roles = [turn["role"] for turn in converted]
    if roles not in (["system", "user", "assistant"], ["user", "assistant"]):
        raise InvalidRowError(source, index, field, f"must be one exchange, [system?, user, assistant]; got {roles}")
    return converted


def alpaca_turns(row: Mapping[str, Any], index: int, source: str) -> list[dict[str, str]]:
    """``system``? + user (``instruction``, then a blank line and ``input`` when there is one) + ``output``."""
    instruction = _text(row, "instruction", index, source)
    extra = _text(row, "input", index, source, required=False)
    system = _text(row, "system", index, source, required=False)
    return ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": f"{instruction}\n\n{extra}" if extra else instruction},
        {"role": "assistant", "content": _text(row, "output", index, source)}]


def to_luffy_row(row: Mapping[str, Any], index: int, source: str, row_format: str) -> Mapping[str, Any]:
    """``row`` (at ``index`` of ``source``) in the LUFFY schema; ``luffy`` rows are returned unchanged."""
    if row_format == "luffy":
        return row
    turns = chat_turns(row, index, source) if row_format == "chat" else alpaca_turns(row, index, source)
    response = turns[-1]["content"]
    answer = row.get("answer")
    if answer is None or str(answer).strip() == "":
        answer = last_boxed(response)
    if answer is None or not str(answer).strip():
        raise InvalidRowError(source, index, "answer", "is missing, and the response has no \\boxed{...} to take it "
                                                       "from (the RL reward's ground truth)")
    return {"data_source": row.get("data_source") or row_format, "prompt": turns[:-1], "target": turns[-1:],
            "ability": "math", "reward_model": {"ground_truth": str(answer).strip(), "style": "rule"},
            "extra_info": {"index": index, "split": "train"}}
