"""SFT label mask and RL rows: prompt tokens -100, every response token supervised, end-of-turn included."""
from __future__ import annotations

import itertools

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.formatting import IGNORE_INDEX, PromptTooLongError, build_sft_example, render_prompt, verl_row
from data.schema import VERL_COLUMNS
from common.models import end_of_turn_token
from toy.tokenizer import train_tokenizer
from toy.arithmetic import DocumentMix, documents

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_THINK = CHATML.replace("'<|im_start|>assistant\n' }}", "'<|im_start|>assistant\n<think>\n' }}")
PROMPT = [{"role": "system", "content": "Please reason step by step."}, {"role": "user", "content": "What is 12 + 30?"}]
TARGET = "<think>\n12 + 30 = 42.\n</think>\nThe answer is \\boxed{42}."


def qwen_style_tokenizer(template: str):
    """A small byte-level BPE with Qwen's special tokens (<|im_start|>, <|im_end|>, <think>, </think>)."""
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    core.train_from_iterator([TARGET, "What is 12 + 30? Please reason step by step."] * 10,
                             trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=special[1:])
    tokenizer.chat_template = template
    return tokenizer


@pytest.fixture(scope="module")
def toy_tokenizer():
    mix = DocumentMix(0.5, {"chain": 1, "steps": 1, "careful": 1, "direct": 1}, {"chain": 1}, {}, 0.0, 2, 4)
    return train_tokenizer(itertools.islice(documents(0, mix), 300), 512)


@pytest.mark.parametrize("make", ["toy", "chatml"])
def test_label_mask(make, toy_tokenizer):
    tokenizer = toy_tokenizer if make == "toy" else qwen_style_tokenizer(CHATML)
    target = "12 + 30 = 42. The answer is \\boxed{42}."
    example = build_sft_example(tokenizer, PROMPT, target, max_length=1000, strip_leading_think="never")
    prompt_ids = tokenizer.encode(render_prompt(tokenizer, PROMPT), add_special_tokens=False)
    n_prompt = len(prompt_ids)
    assert example.input_ids[:n_prompt] == prompt_ids
    assert example.labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert example.labels[n_prompt:] == example.input_ids[n_prompt:]  # every response token supervised
    assert example.num_response_tokens == len(example.input_ids) - n_prompt
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert example.labels[-1] == im_end and example.labels.count(im_end) == 1  # end-of-turn included, once
    assert tokenizer.decode(example.labels[n_prompt:]) == target + "<|im_end|>"
    assert not example.truncated


def test_end_of_turn_comes_from_the_template(toy_tokenizer):
    assert end_of_turn_token(toy_tokenizer) == "<|im_end|>"
    assert end_of_turn_token(qwen_style_tokenizer(CHATML)) == "<|im_end|>"  # not the tokenizer's eos


@pytest.mark.parametrize("template, mode, stripped", [
    (CHATML_THINK, "auto", True), (CHATML_THINK, "never", False),
    (CHATML, "auto", False), (CHATML, "always", True),
])
def test_leading_think(template, mode, stripped):
    tokenizer = qwen_style_tokenizer(template)
    example = build_sft_example(tokenizer, PROMPT, TARGET, max_length=1000, strip_leading_think=mode)
    response = tokenizer.decode([t for t in example.labels if t != IGNORE_INDEX])
    expected = TARGET[len("<think>\n"):] if stripped else TARGET
    assert response == expected + "<|im_end|>"


def test_truncation_keeps_the_first_max_length_tokens(toy_tokenizer):
    full = build_sft_example(toy_tokenizer, PROMPT, "1 + 2 = 3. The answer is \\boxed{3}.", 1000, "never")
    n_prompt = full.labels.count(IGNORE_INDEX)
    cut = build_sft_example(toy_tokenizer, PROMPT, "1 + 2 = 3. The answer is \\boxed{3}.", n_prompt + 3, "never")
    assert cut.truncated and cut.num_response_tokens == 3
    assert cut.input_ids == full.input_ids[:n_prompt + 3] and cut.labels == full.labels[:n_prompt + 3]
    with pytest.raises(PromptTooLongError):
        build_sft_example(toy_tokenizer, PROMPT, "x", n_prompt, "never")


def test_verl_row_has_exactly_verls_columns():
    luffy = {"data_source": "toy", "prompt": PROMPT, "target": [{"role": "assistant", "content": "x"}],
             "ability": "math", "reward_model": {"ground_truth": "42", "style": "rule"},
             "extra_info": {"index": 5, "split": "default"}}
    row = verl_row(luffy, "train")
    assert tuple(row) == VERL_COLUMNS
    assert row["prompt"] == PROMPT
    assert row["reward_model"] == {"style": "rule", "ground_truth": "42"}
    assert row["extra_info"] == {"index": 5, "split": "train"}
