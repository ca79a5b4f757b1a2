"""The toy tokenizer: byte-level BPE with single-digit tokens and a Qwen-style (ChatML) chat template.

Built with ``tokenizers`` and wrapped in ``PreTrainedTokenizerFast`` so transformers, vLLM and verl load it from
the saved folder unchanged. Properties the rest of the pipeline relies on (unit-tested):

* every digit is its own token (the pre-tokenizer splits digits before byte-level BPE);
* ``"\\n"`` is exactly one token (verl's Qwen agent loop requires it);
* special tokens ``<|endoftext|>`` (0), ``<|im_start|>`` (1), ``<|im_end|>`` (2, eos), ``<|pad|>`` (3);
* the chat template renders ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message and
  ``<|im_start|>assistant\\n`` as the generation prompt.
"""
from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
DOCUMENT_SEPARATOR, _, END_OF_TURN, PAD = SPECIAL_TOKENS
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """A ``PreTrainedTokenizerFast`` trained on ``texts`` (eos ``<|im_end|>``, pad ``<|pad|>``, left padding)."""
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=END_OF_TURN, pad_token=PAD, bos_token=None, unk_token=None,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (END_OF_TURN, PAD)],
        padding_side="left", clean_up_tokenization_spaces=False, model_max_length=1 << 16)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
