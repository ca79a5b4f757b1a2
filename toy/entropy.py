"""Entropy profile of a toy model on its own solutions: where is it unsure, at the fork or in the arithmetic?

For each held-out prompt the model samples ``samples_per_prompt`` solutions at T = 1 (top-k and top-p off). At every
generated token t, H_t = −Σ_v p_t(v) · ln p_t(v) with p_t = softmax(logits_t), the distribution the token was drawn
from. Tokens are put in three classes and H is averaged per class (in nats):

* ``fork``   the first response token, which names the strategy (forking world) or the style (arithmetic world); with
             ``toy.fork_position=mid`` the token after the fixed prefix's length (:func:`fork_token_index`);
* ``digits`` every later token that decodes to a single digit (the toy tokenizer gives each digit its own token):
             computed and copied numbers, including the boxed answer;
* ``other``  every other token up to and including the first ``<|im_end|>`` (words, operators, punctuation).

The vocabulary is the toy tokenizer's (a few hundred entries), so the full softmax is taken at once.
:func:`fork_profile` adds, for the forking world, each strategy's share of the samples per family; the base stage
records it in the base manifest, and the command line measures any exported model (e.g. an SFT model's fork
entropy, prediction 2 of docs/results/2026-11-23-forking-predictions.md):

    python -m toy.entropy runs/forking/sft/toy/sft-<id>/hf [--problems 60] [--samples 4] [--seed 0]
    python -m toy.entropy runs/forking/sft/toy/sft-<id>/hf --fork-only [--problems 300]

``--fork-only`` (:func:`fork_distribution`) needs no sampling: the fork is the first response token (or the first after
the fixed prefix), so its distribution is the model's next-token distribution after the prompt (and the prefix). Per family it gives the mean fork entropy
over the vocabulary and the mean probability of each strategy's opening token, exactly, from one forward pass per
problem.
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass

import torch

from common import forks
from common.config.toy import FORK_FAMILIES, FORK_STRATEGIES, ToyConfig, fork_prefix
from common.forks import token_entropy
from common.models import load_causal_lm, load_tokenizer
from common.seeding import derive_seed
from toy import forking, worlds
from toy.pretrain import EVAL_MAX_NEW_TOKENS, boxed_integer
from toy.arithmetic import SYSTEM_PROMPT, question

TOKEN_CLASSES = ("fork", "digits", "other")
HIGH_ENTROPY_NATS = 0.1
"""A digit token above this entropy counts in ``digits_above_0.1``."""


@dataclass
class EntropyProfile:
    """Mean entropy per token class, token counts, and the sampled texts (for per-strategy statistics)."""

    mean_entropy: dict[str, float]
    num_tokens: dict[str, int]
    digits_above_threshold: float
    """Share of digit tokens with H > :data:`HIGH_ENTROPY_NATS`."""
    texts: list[str]
    """Samples in prompt order, ``samples_per_prompt`` consecutive samples per prompt."""

    def metrics(self) -> dict[str, float | int]:
        """Flat manifest metrics: ``entropy_<class>_nats``, ``entropy_<class>_tokens``, ``entropy_digits_above_0.1``."""
        flat: dict[str, float | int] = {}
        for name in TOKEN_CLASSES:
            flat[f"entropy_{name}_nats"] = self.mean_entropy[name]
            flat[f"entropy_{name}_tokens"] = self.num_tokens[name]
        flat[f"entropy_digits_above_{HIGH_ENTROPY_NATS:g}"] = self.digits_above_threshold
        return flat


def digit_token_mask(tokenizer) -> torch.Tensor:
    """``[vocab]`` bool: the ids that decode to exactly one digit."""
    return torch.tensor([tokenizer.decode([i]) in tuple("0123456789") for i in range(len(tokenizer))])


def classify_tokens(tokens: torch.Tensor, digit_ids: torch.Tensor, eos_id: int, fork_index: int = 0) -> torch.Tensor:
    """``[batch, steps]`` class index per generated token (0 fork, at ``fork_index``, 1 digits, 2 other, -1 after the
    first eos)."""
    classes = torch.where(digit_ids[tokens], 1, 2)
    classes[:, fork_index] = 0
    after_eos = (tokens == eos_id).long().cumsum(dim=1) - (tokens == eos_id).long() > 0
    classes[after_eos] = -1
    return classes


def chat_messages(text: str) -> list[dict[str, str]]:
    """The toy chat prompt of a question: the toy system prompt, then the question."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]


def chat_prompt(tokenizer, text: str) -> str:
    """The toy chat prompt of a question as text, ending where the response's first token goes."""
    return tokenizer.apply_chat_template(chat_messages(text), add_generation_prompt=True, tokenize=False)


@torch.no_grad()
def entropy_profile(model, tokenizer, questions: list[str], *, samples_per_prompt: int, max_new_tokens: int,
                    seed: int, prompts_per_batch: int = 16, fork_index: int = 0) -> EntropyProfile:
    """The :class:`EntropyProfile` of ``model`` on chat prompts built from ``questions`` (toy system prompt); the fork
    is generated token ``fork_index`` (:func:`fork_token_index`)."""
    digit_ids = digit_token_mask(tokenizer)
    eos_id = tokenizer.eos_token_id
    sums = torch.zeros(len(TOKEN_CLASSES), dtype=torch.float64)
    counts = torch.zeros(len(TOKEN_CLASSES), dtype=torch.long)
    digits_high = 0
    texts: list[str] = []
    torch.manual_seed(seed)
    for start in range(0, len(questions), prompts_per_batch):
        prompts = [chat_prompt(tokenizer, q) for q in questions[start:start + prompts_per_batch]]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        output = model.generate(**encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=max_new_tokens, num_return_sequences=samples_per_prompt,
                                output_logits=True, return_dict_in_generate=True)
        tokens = output.sequences[:, encoded["input_ids"].shape[1]:].cpu()
        entropy = token_entropy(torch.stack(output.logits, dim=1)).cpu()
        classes = classify_tokens(tokens, digit_ids, eos_id, fork_index)
        for index in range(len(TOKEN_CLASSES)):
            selected = entropy[classes == index]
            sums[index] += selected.double().sum()
            counts[index] += selected.numel()
        digits_high += int((entropy[classes == 1] > HIGH_ENTROPY_NATS).sum())
        texts.extend(tokenizer.batch_decode(tokens, skip_special_tokens=True))
    means = {name: float(sums[i] / counts[i]) if counts[i] else float("nan") for i, name in enumerate(TOKEN_CLASSES)}
    return EntropyProfile(means, {name: int(counts[i]) for i, name in enumerate(TOKEN_CLASSES)},
                          digits_high / int(counts[1]) if counts[1] else float("nan"), texts)


def fork_token_index(tokenizer, toy: ToyConfig) -> int:
    """Which response token is the fork: 0, or the token count of the fixed prefix before it (``toy.fork_position=mid``,
    :func:`common.config.toy.fork_prefix`)."""
    return forks.fork_index(tokenizer, fork_prefix(toy.fork_position))


def fork_profile(model, tokenizer, toy: ToyConfig) -> dict[str, float | int]:
    """:func:`entropy_profile` on ``toy.fork_entropy_problems`` held-out forking problems (a third per family,
    ``toy.fork_entropy_samples`` samples each), plus per family ``samples_<family>_accuracy`` and
    ``samples_<family>_<strategy>_share`` (the share of samples opening with that strategy)."""
    problems = worlds.health_check_problems(toy, toy.fork_entropy_problems, derive_seed(toy.world_seed, "entropy"))
    rng = random.Random(toy.world_seed)
    profile = entropy_profile(model, tokenizer, [question(p, rng) for p in problems],
                              samples_per_prompt=toy.fork_entropy_samples, max_new_tokens=EVAL_MAX_NEW_TOKENS,
                              seed=derive_seed(toy.world_seed, "entropy-samples"),
                              fork_index=fork_token_index(tokenizer, toy))
    metrics = profile.metrics()
    samples = [(problems[index // toy.fork_entropy_samples], text) for index, text in enumerate(profile.texts)]
    for family in FORK_FAMILIES:
        mine = [(p, t) for p, t in samples if p.family == family]
        if not mine:
            continue
        metrics[f"samples_{family}_accuracy"] = sum(boxed_integer(t) == p.answer for p, t in mine) / len(mine)
        for strategy in FORK_STRATEGIES:
            metrics[f"samples_{family}_{strategy}_share"] = sum(
                forking.solution_strategy(t) == strategy for _, t in mine) / len(mine)
    return metrics


def fork_distribution(model, tokenizer, toy: ToyConfig) -> dict[str, float]:
    """:func:`common.forks.fork_distribution` on ``toy.fork_entropy_problems`` held-out problems, a third per family
    (the problems :func:`fork_profile` samples), after the world's fixed prefix when the fork is mid-response."""
    problems = worlds.health_check_problems(toy, toy.fork_entropy_problems, derive_seed(toy.world_seed, "entropy"))
    rng = random.Random(toy.world_seed)
    prompts: dict[str, list[list[dict[str, str]]]] = {}
    for problem in problems:
        prompts.setdefault(problem.family, []).append(chat_messages(question(problem, rng)))
    return forks.fork_distribution(model, tokenizer, prompts, prefix=fork_prefix(toy.fork_position))


def main() -> None:
    parser = argparse.ArgumentParser(description="Entropy profile of an exported toy model on the forking world.")
    parser.add_argument("model_dir", help="an HF folder with the toy tokenizer (a base or SFT export)")
    parser.add_argument("--problems", type=int, default=ToyConfig.fork_entropy_problems)
    parser.add_argument("--samples", type=int, default=ToyConfig.fork_entropy_samples)
    parser.add_argument("--seed", type=int, default=0, help="toy.world_seed (which problems and samples)")
    parser.add_argument("--fork-only", action="store_true",
                        help="the exact fork distribution per family, one forward pass per problem (no sampling)")
    args = parser.parse_args()
    toy = ToyConfig(world="forking", world_seed=args.seed, fork_entropy_problems=args.problems,
                    fork_entropy_samples=args.samples)
    toy.validate()
    measure = fork_distribution if args.fork_only else fork_profile
    print(json.dumps(measure(load_causal_lm(args.model_dir).eval(), load_tokenizer(args.model_dir), toy), indent=1))


if __name__ == "__main__":
    main()
