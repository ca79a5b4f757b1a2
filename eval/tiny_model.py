"""A tiny random Qwen3 (head_dim 64, what vLLM's CPU attention needs) with a BPE tokenizer and a ChatML template.

Used by the evaluation tests and ``bench/vllm_vs_hf.py`` as a model that any ``from_pretrained`` and ``vllm.LLM``
load in well under a second. Its output is random text; what it exercises is the plumbing, not the quality.
"""
from __future__ import annotations

from pathlib import Path

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen's chat format; the LUFFY variant appends ``<think>\\n`` to the generation prompt."""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]
"""Added as normal tokens, as in Qwen3: decoding with ``skip_special_tokens`` keeps them in the text."""
_CORPUS = [
    "Compute 3 + 4 * 5. <think>\n4 * 5 = 20. 3 + 20 = 23.</think>\nThe answer is \\boxed{23}.",
    "What is \\frac{1}{2} + \\frac{1}{3}? The answer is \\boxed{\\frac{5}{6}}.",
    "Evaluate \\sqrt{16} - 2^{3}. We get 4 - 8 = -4, so \\boxed{-4}.",
    "Let x = 12. Then x^2 = 144 and the final answer is \\boxed{144}.",
]


def build_tiny_qwen3(folder: str | Path, *, hidden_size: int = 128, num_layers: int = 2, vocab_size: int = 384,
                     think_prompt: bool = False, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Writes a random Qwen3 (``hidden_size``, ``num_layers``, 64-dim heads) and its tokenizer to ``folder``.

    ``think_prompt`` makes the chat template's generation prompt end with ``<think>\\n`` (the LUFFY convention).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_CORPUS * 8, trainer=trainer)
    template = CHATML_TEMPLATE.replace("assistant\n{% endif %}", "assistant\n<think>\n{% endif %}") \
        if think_prompt else CHATML_TEMPLATE
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        padding_side="left", chat_template=template)
    tokenizer.add_tokens(THINK_TOKENS)
    tokenizer.save_pretrained(folder)

    torch.manual_seed(seed)
    heads = max(1, hidden_size // 64)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=3 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=1,
                         head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)
    model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    return folder
