"""A tiny random Qwen3 (64-dim heads, what vLLM's CPU attention needs) with a byte-level BPE tokenizer and a ChatML
template, saved as an HF folder.

Used by the tests and the benches (by no pipeline stage) as a model that any ``from_pretrained`` and ``vllm.LLM``
load in well under a second; it lives beside the benches because they need it outside pytest (the name ``tests`` is
taken by a package verl installs). Its output is random text; what it exercises is the plumbing, not the quality.
``"\\n"`` is one token (the byte-level alphabet is in the vocabulary), digits are split one by one as in Qwen.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen's chat format; the LUFFY variant appends ``<think>\\n`` to the generation prompt."""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""Ids 0, 1, 2."""
THINK_TOKENS = ["<think>", "</think>"]
"""Added as normal tokens, as in Qwen3: decoding with ``skip_special_tokens`` keeps them in the text."""
TRAINING_TEXTS = [
    "Compute 3 + 4 * 5. <think>\n4 * 5 = 20. 3 + 20 = 23.</think>\nThe answer is \\boxed{23}.",
    "What is \\frac{1}{2} + \\frac{1}{3}? The answer is \\boxed{\\frac{5}{6}}.",
    "Evaluate \\sqrt{16} - 2^{3}. We get 4 - 8 = -4, so \\boxed{-4}.",
    "Let x = 12. Then x^2 = 144 and the final answer is \\boxed{144}.",
]
"""The BPE tokenizer's training corpus (its merges make these words a few tokens each)."""


def random_qwen3(*, vocab_size: int, hidden_size: int, num_layers: int, intermediate_size: int | None = None,
                 num_heads: int | None = None, num_kv_heads: int = 1, head_dim: int = 64,
                 max_position_embeddings: int = 2048, dtype: str = "float32", seed: int = 0,
                 tie_word_embeddings: bool = True, **token_ids: Any):
    """A randomly initialised ``Qwen3ForCausalLM``, in memory: tied embeddings (as Qwen3-4B and smaller), or with
    ``tie_word_embeddings=False`` an ``lm_head`` of its own (as Qwen3-8B).

    Defaults: ``intermediate_size = 3 * hidden_size``, ``num_heads = max(1, hidden_size // head_dim)``;
    ``token_ids`` (``eos_token_id``, ``pad_token_id``, ...) go to the model config.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden_size,
                         intermediate_size=intermediate_size or 3 * hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads or max(1, hidden_size // head_dim),
                         num_key_value_heads=num_kv_heads, head_dim=head_dim,
                         max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie_word_embeddings,
                         **{"bos_token_id": None, **token_ids})
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).to(getattr(torch, dtype))


def build_tiny_tokenizer(*, vocab_size: int = 384, think_prompt: bool = False, eos_token: str = "<|im_end|>"):
    """Byte-level BPE trained on :data:`TRAINING_TEXTS`, pad ``<|endoftext|>``, left padding, ChatML template.

    ``think_prompt`` makes the generation prompt end with ``<think>\\n`` (the LUFFY convention); ``eos_token``
    other than ``<|im_end|>`` gives a tokenizer whose eos disagrees with its template, as Qwen base models' do.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(TRAINING_TEXTS * 8, trainer=trainer)
    template = CHATML_TEMPLATE.replace("assistant\n{% endif %}", "assistant\n<think>\n{% endif %}") \
        if think_prompt else CHATML_TEMPLATE
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos_token, pad_token="<|endoftext|>",
                                        padding_side="left", chat_template=template)
    tokenizer.add_tokens(THINK_TOKENS)
    return tokenizer


def build_tiny_qwen3(folder: str | Path, *, hidden_size: int = 128, num_layers: int = 2, vocab_size: int = 384,
                     intermediate_size: int | None = None, max_position_embeddings: int = 2048,
                     think_prompt: bool = False, eos_token: str = "<|im_end|>", dtype: str = "bfloat16",
                     seed: int = 0, tie_word_embeddings: bool = True) -> Path:
    """Writes :func:`random_qwen3` (``hidden_size // 64`` heads of 64, one kv head; tied or untied head) and
    :func:`build_tiny_tokenizer` to ``folder``; the generation config stops at the tokenizer's eos."""
    from transformers import GenerationConfig

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(vocab_size=vocab_size, think_prompt=think_prompt, eos_token=eos_token)
    tokenizer.save_pretrained(folder)
    model = random_qwen3(vocab_size=len(tokenizer), hidden_size=hidden_size, num_layers=num_layers,
                         intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
                         dtype=dtype, seed=seed, tie_word_embeddings=tie_word_embeddings,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    return folder
