"""Chat formatting: token ids + label mask for SFT, and verl's parquet row for RL.

SFT example (LUFFY's ``rl_dataset_with_target.py``; docs/data.md)::

    prompt   = apply_chat_template([system, user], add_generation_prompt=True)
    response = target (minus a leading "<think>\\n" when the prompt already ends with it) + end-of-turn token
    ids      = tokens(prompt) + tokens(response)          labels = [-100] * len(tokens(prompt)) + tokens(response)

The end-of-turn token (``<|im_end|>`` for ChatML) is the first special token the template writes after an assistant
message; it is supervised so the model learns to stop. What the template writes after it (``"\\n"``) is never
generated and is not part of the example. Rows longer than ``max_length`` keep their first ``max_length`` tokens
(``truncated``); a prompt that alone fills ``max_length`` leaves no response token and raises
:class:`PromptTooLongError` (the caller counts such rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from common.models import end_of_turn_token
from common.paths import IGNORE_INDEX

THINK_PREFIX = "<think>\n"


class PromptTooLongError(ValueError):
    """The templated prompt alone reaches ``max_length``: no response token would be supervised."""


@dataclass
class SFTExample:
    input_ids: list[int]
    labels: list[int]
    num_response_tokens: int
    truncated: bool


def render_prompt(tokenizer, prompt_messages: Sequence[Mapping[str, str]]) -> str:
    """The chat template over the prompt turns, ending with the generation prompt."""
    return tokenizer.apply_chat_template([dict(m) for m in prompt_messages], add_generation_prompt=True,
                                         tokenize=False)


def strip_think(prompt_text: str, target_text: str, mode: str) -> str:
    """Drops the target's leading ``<think>\\n`` (``always``; ``auto``: only if the prompt already ends with it)."""
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"strip_leading_think must be auto, always or never; got {mode!r}")
    starts = target_text.startswith(THINK_PREFIX)
    if starts and (mode == "always" or (mode == "auto" and prompt_text.endswith(THINK_PREFIX))):
        return target_text[len(THINK_PREFIX):]
    return target_text


def build_sft_example(tokenizer, prompt_messages: Sequence[Mapping[str, str]], target_text: str,
                      max_length: int, strip_leading_think: str = "auto") -> SFTExample:
    """Token ids and labels (-100 on the prompt) of one SFT example (formula in the module doc)."""
    prompt_text = render_prompt(tokenizer, prompt_messages)
    response_text = strip_think(prompt_text, target_text, strip_leading_think) + end_of_turn_token(tokenizer)
    return example_from_texts(tokenizer, prompt_text, response_text, max_length)


def example_from_texts(tokenizer, prompt_text: str, response_text: str, max_length: int) -> SFTExample:
    """The prompt's tokens with label -100, then the response's, cut to ``max_length`` (a prompt that reaches it
    raises :class:`PromptTooLongError`)."""
    prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
    response_ids = tokenizer.encode(response_text, add_special_tokens=False)
    if len(prompt_ids) >= max_length:
        raise PromptTooLongError(f"prompt has {len(prompt_ids)} tokens, max_length is {max_length}")
    room = max_length - len(prompt_ids)
    truncated = len(response_ids) > room
    response_ids = response_ids[:room]
    return SFTExample(input_ids=prompt_ids + response_ids,
                      labels=[IGNORE_INDEX] * len(prompt_ids) + response_ids,
                      num_response_tokens=len(response_ids), truncated=truncated)


def verl_row(row: Mapping[str, Any], split: str) -> dict[str, Any]:
    """verl's RLHF parquet row (docs/data.md, "Outputs") from a LUFFY row; ``extra_info.split`` names the part."""
    return {
        "data_source": row["data_source"],
        "prompt": [{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
        "ability": row["ability"],
        "reward_model": {"style": row["reward_model"]["style"], "ground_truth": row["reward_model"]["ground_truth"]},
        "extra_info": {"index": int(row["extra_info"]["index"]), "split": split},
    }
