"""The shared tokenizer loader: eos is the chat template's end-of-turn token, a pad token always exists, and a
tokenizer without a chat template is refused with its path; the exports' eos alignment on hand-made generation
configs; the tiny BPE tokenizer's fixed ids; exported weights readable as the umask says."""
from __future__ import annotations

import os

import pytest
from tokenizers import Tokenizer, models
from transformers import GenerationConfig, PreTrainedTokenizerFast

from bench.tiny_model import CHATML_TEMPLATE, build_tiny_qwen3, build_tiny_tokenizer
from common.models import (ChatTemplateError, EosAlignment, align_eos, end_of_turn_token, load_causal_lm,
                           load_tokenizer)


def test_eos_becomes_the_end_of_turn_and_pad_is_kept(tmp_path):
    build_tiny_tokenizer(eos_token="<|endoftext|>").save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 0)


def test_missing_pad_becomes_the_end_of_turn(tmp_path):
    core = Tokenizer(models.WordLevel({"<unk>": 0}, "<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<|endoftext|>",
                            chat_template=CHATML_TEMPLATE,
                            additional_special_tokens=["<|im_start|>", "<|im_end|>"]).save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"


# ids of the tiny tokenizer: <|endoftext|> 0 (also its pad), <|im_start|> 1, <|im_end|> 2 (the end-of-turn)
@pytest.mark.parametrize("eos_ids, pad_id, aligned_ids, aligned_pad, changed", [
    (0, None, [2, 0], 0, True),  # a Qwen base model's: the end-of-turn goes first, pad from the tokenizer
    ([0, 2], 0, [2, 0], 0, True),  # present but not first: moved first
    (None, 7, [2], 7, True),  # none: the end-of-turn alone, a set pad is kept
    (2, 0, [2], 0, True),  # one id as an int becomes a list
    ([2, 0], 0, [2, 0], 0, False),  # aligned already: nothing to save
])
def test_align_eos(eos_ids, pad_id, aligned_ids, aligned_pad, changed):
    tokenizer = build_tiny_tokenizer(eos_token="<|im_end|>")
    generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=pad_id)
    assert align_eos(tokenizer, generation_config) == EosAlignment(tokenizer=False, generation_config=changed)
    assert (generation_config.eos_token_id, generation_config.pad_token_id) == (aligned_ids, aligned_pad)


def test_align_eos_fixes_a_tokenizer_whose_eos_is_not_the_end_of_turn():
    tokenizer = build_tiny_tokenizer(eos_token="<|endoftext|>")
    assert align_eos(tokenizer, GenerationConfig(eos_token_id=[2, 0], pad_token_id=0)) == EosAlignment(True, False)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)


def test_no_chat_template_names_the_path(tmp_path):
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ChatTemplateError, match=f"tokenizer at {tmp_path} has no chat template"):
        load_tokenizer(tmp_path)


def test_template_without_a_closing_special_token_is_refused():
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ChatTemplateError, match="no special token follows the assistant message"):
        end_of_turn_token(tokenizer)


def test_tiny_tokenizer_ids():
    tokenizer = build_tiny_tokenizer(think_prompt=True)
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert len(tokenizer("\n", add_special_tokens=False)["input_ids"]) == 1
    assert tokenizer.convert_ids_to_tokens(tokenizer("144", add_special_tokens=False)["input_ids"]) == ["1", "4", "4"]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                           tokenize=False)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_an_exported_model_is_readable_as_the_umask_says(tmp_path, umask):
    # Issue 39, item 5: every hf/model.safetensors was 0600 (safetensors creates its files so), while config.json
    # and the manifests follow the umask.
    import torch
    from transformers import AutoConfig

    from sft.export import write_hf_folder

    source = build_tiny_qwen3(tmp_path / "source", hidden_size=64, num_layers=1)
    model = load_causal_lm(source)
    previous = os.umask(umask)
    try:
        write_hf_folder(AutoConfig.from_pretrained(source), model.state_dict(), load_tokenizer(source),
                        GenerationConfig.from_pretrained(source), tmp_path / "hf", torch.bfloat16)
    finally:
        os.umask(previous)
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "hf").iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == 0o666 & ~umask
