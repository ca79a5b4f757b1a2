"""The fork of a forking-world model, exactly (docs/toy_world.md, "The forking world"): every solution opens with its
strategy's name, so the model's choice of strategy is its first response token, and its distribution is the
next-token distribution p(· | prompt) after the chat prompt (generation prompt added). One forward pass per prompt,
no sampling. Per family of problems:

* the fork entropy H = −Σ_v p(v | prompt) · ln p(v | prompt) over the vocabulary, in nats, mean over the prompts;
* p(strategy) = p(first token of the strategy's opening | prompt), mean over the prompts.

The toy stage's command line (``python -m toy.entropy --fork-only``), ``scripts/toy_styles.py --fork`` and the
report's fork table (:mod:`report.sections.head`) all measure here; :func:`summarize` pools one method's models (its
seeds) the way both tables show them. torch is imported where a model is measured, so the report and the script
start without it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from common.config.toy import FORK_BEST_STRATEGY, FORK_OPENINGS

if TYPE_CHECKING:
    import torch

FORK_ENTROPY = "fork_entropy_nats"
"""The fork entropy over every prompt, in nats (:func:`fork_distribution`)."""


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = −Σ p ln p over the last dimension, in float32."""
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def best_strategy_key(family: str) -> str:
    """The :func:`fork_distribution` key of the probability of ``family``'s always-right strategy."""
    return f"fork_{family}_p_{FORK_BEST_STRATEGY[family]}"


def fork_index(tokenizer: Any, prefix: str) -> int:
    """Which response token is the fork: 0, or the token count of ``prefix`` (the fixed text before the fork) without
    its trailing space, which belongs to the fork token."""
    before_fork = prefix.rstrip()
    return len(tokenizer(before_fork, add_special_tokens=False)["input_ids"]) if before_fork else 0


def fork_distribution(model: Any, tokenizer: Any, prompts: Mapping[str, Sequence[list[dict[str, str]]]],
                      openings: Mapping[str, str] = FORK_OPENINGS, prefix: str = "") -> dict[str, float]:
    """On ``prompts`` (family → chat prompts, each a list of ``{role, content}`` messages): per family
    ``fork_<family>_entropy_nats`` (mean H over its prompts) and ``fork_<family>_p_<strategy>`` (mean probability of
    the strategy's opening token; ``openings``: strategy → its first words), and :data:`FORK_ENTROPY` over all
    prompts. ``prefix``: the fixed text every response writes before the fork
    (:func:`common.config.toy.fork_prefix`), read after the prompt; the fork is the token after it."""
    import torch

    before_fork, index = prefix.rstrip(), fork_index(tokenizer, prefix)
    opening = {strategy: tokenizer(prefix + text, add_special_tokens=False)["input_ids"][index]
               for strategy, text in openings.items()}
    by_family: dict[str, list[dict[str, float]]] = {}
    for family, family_prompts in prompts.items():
        for messages in family_prompts:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + before_fork
            encoded = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(model.device)
            with torch.no_grad():
                logits = model(**encoded).logits[0, -1].float()
            probabilities = torch.softmax(logits, dim=-1)
            by_family.setdefault(family, []).append(
                {"entropy_nats": float(token_entropy(logits)),
                 **{f"p_{strategy}": float(probabilities[token]) for strategy, token in opening.items()}})
    everything = [values for rows in by_family.values() for values in rows]
    result = {FORK_ENTROPY: sum(values["entropy_nats"] for values in everything) / len(everything)}
    for family, rows in by_family.items():
        result.update({f"fork_{family}_{name}": sum(values[name] for values in rows) / len(rows) for name in rows[0]})
    return result


def summarize(forks: Sequence[Mapping[str, float]], families: Sequence[str]) -> dict[str, Any]:
    """One method's models (its seeds) pooled: ``fork_entropy_nats`` (their mean), ``fork_entropy_range`` ([min,
    max] over them) and, per family of ``families``, the mean probability of its always-right strategy (key
    :func:`best_strategy_key`)."""
    entropies = [fork[FORK_ENTROPY] for fork in forks]
    return {FORK_ENTROPY: sum(entropies) / len(entropies), "fork_entropy_range": [min(entropies), max(entropies)],
            **{best_strategy_key(family): sum(fork[best_strategy_key(family)] for fork in forks) / len(forks)
               for family in families}}
