"""The forking toy world (``toy.world=forking``): two-digit sums solved by one of three mental-arithmetic strategies.

In the arithmetic world (``arithmetic.py``) the tiny model is unsure of its own sums, so its high-entropy tokens are the
answer digits. Here every computed token is a single-digit fact or a copy, and the uncertainty sits at one place:
the first token of the solution, which names the strategy. Each strategy is a short procedure whose every written
equation is true, but whose way of assembling the answer is valid only under a condition on the digits:

* ``column``  ``Column: 5 + 8 = 13, write 3 carry 1. 4 + 3 + 1 = 8, write 8. The answer is \\boxed{83}.``
              Right to left with a carry, one digit written per column: valid iff a + b ≤ 99 (the final carry of a
              three-digit sum is dropped: 75 + 48 gives ``23``).
* ``place``   ``Place value: 4 + 3 = 7. 5 + 8 = 13. The answer is \\boxed{713}.``
              Left to right, the place sums written side by side: valid iff the ones do not carry (aₒ + bₒ ≤ 9).
* ``round``   ``Round: 38 = 40 - 2. 4 + 4 = 8. 5 - 2 = 3. The answer is \\boxed{83}.``
              b rounded up to the next ten B = b + e, tens of a + B, then the ones of a minus e: valid iff
              aₒ ≥ e, i.e. iff the ones carry (aₒ + bₒ ≥ 10); otherwise the ones step takes the smaller digit from
              the larger (``2 - 1 = 1``: 41 + 38 gives ``81``).

A problem is ``a + b`` with a in 10-99 and b in 11-89, b not a multiple of ten. Every problem is in exactly one of
three families, and each family has one strategy that is always right (share of the family's problems on which
each strategy is right in brackets; ``small`` splits by whether the ones carry):

=========  ===================================  ========  ========  ========
family     problems                             column    place     round
=========  ===================================  ========  ========  ========
``small``  a + b ≤ 99                           1         (≈ 0.56)  (≈ 0.44)
``carry``  a + b ≥ 100, the ones carry          0         0         1
``plain``  a + b ≥ 100, the ones do not carry   0         1         0
=========  ===================================  ========  ========  ========

Pretraining documents use the family's best strategy with probability ``best_share`` and the other two evenly,
and keep the answer the strategy gives, right or wrong: the documents are noisy at the fork, never in the
arithmetic. The SFT rows come from a narrow teacher: one strategy draw per problem from ``teacher_weights``
(``place`` 0.9, ``column`` 0.1, never ``round`` by default), so ``place`` dominates the rows on every family,
including ``small`` problems where ``column`` is the reliable choice and ``carry`` problems, which only ``round``
solves. By default the rows keep the teacher's answers, right or wrong (an unverified distillation set);
``verified`` keeps only right ones, as a verifier-filtered set does, which leaves every family's rows right
conditional on the problem (docs/results/2026-11-23-forking-verified-teacher.md). Held-out problems (md5
of the expression ≡ 0 mod 10, as in the arithmetic world) never reach a document or a row; the benchmarks
``toy_fork_<family>`` are drawn from them.
"""
from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Iterator, Mapping

from common.config.toy import FORK_BEST_STRATEGY, FORK_FAMILIES, FORK_OPENINGS, FORK_STRATEGIES, MID_RESPONSE_PREFIX
from common.paths import BEHAVIOUR_LOGPROBS_COLUMN
from toy.arithmetic import SYSTEM_PROMPT, chat_text, is_held_out, luffy_row, question

WORST_STRATEGY = {"small": "round", "carry": "column", "plain": "column"}
"""The strategy right least often on a family (ties: the first of ``FORK_STRATEGIES``): what the base model's
documents prefer in the world ``toy.fork_base_prefers=worst``."""


@dataclass(frozen=True)
class Problem:
    """``a + b``."""

    a: int
    b: int

    @property
    def expression(self) -> str:
        return f"{self.a} + {self.b}"

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def family(self) -> str:
        return family_of(self.a, self.b)

    @property
    def held_out(self) -> bool:
        return is_held_out(self.expression)


def family_of(a: int, b: int) -> str:
    """``small`` (a + b ≤ 99), else ``carry`` or ``plain`` by whether the ones digits sum to 10 or more."""
    if a + b <= 99:
        return "small"
    return "carry" if a % 10 + b % 10 >= 10 else "plain"


@functools.cache
def family_problems(family: str, held_out: bool) -> tuple[Problem, ...]:
    """Every problem of ``family`` that is (not) held out, in a fixed order."""
    if family not in FORK_FAMILIES:
        raise ValueError(f"unknown forking family {family!r}; expected one of {FORK_FAMILIES}")
    return tuple(Problem(a, b) for a in range(10, 100) for b in range(11, 90)
                 if b % 10 and family_of(a, b) == family and is_held_out(f"{a} + {b}") == held_out)


# ------------------------------------------------------------------------------------------ strategies
def _digits(n: int) -> tuple[int, int]:
    return divmod(n, 10)


def strategy_answer_text(problem: Problem, strategy: str) -> str:
    """The digits a strategy boxes (may have a leading zero, e.g. ``column`` on 55 + 45 gives ``00``)."""
    a_tens, a_ones = _digits(problem.a)
    b_tens, b_ones = _digits(problem.b)
    if strategy == "column":
        ones = a_ones + b_ones
        tens = a_tens + b_tens + ones // 10
        return f"{tens % 10}{ones % 10}"
    if strategy == "place":
        return f"{a_tens + b_tens}{a_ones + b_ones}"
    if strategy == "round":
        excess = 10 - b_ones
        return f"{a_tens + b_tens + 1}{abs(a_ones - excess)}"
    raise ValueError(f"unknown forking strategy {strategy!r}; expected one of {FORK_STRATEGIES}")


def strategy_answer(problem: Problem, strategy: str) -> int:
    return int(strategy_answer_text(problem, strategy))


def is_reliable(problem: Problem, strategy: str) -> bool:
    """Whether ``strategy`` gives the right answer on ``problem`` (the conditions in the module doc)."""
    return strategy_answer(problem, strategy) == problem.answer


def solve(problem: Problem, strategy: str, prefix: str = "") -> str:
    """The worked solution of ``problem`` by ``strategy`` after ``prefix`` (:func:`common.config.toy.fork_prefix`;
    deterministic, wrong where the strategy is unreliable)."""
    a_tens, a_ones = _digits(problem.a)
    b_tens, b_ones = _digits(problem.b)
    if strategy == "column":
        ones = a_ones + b_ones
        carry = ones // 10
        tens = a_tens + b_tens + carry
        body = (f"{a_ones} + {b_ones} = {ones}, write {ones % 10} carry {carry}. "
                f"{a_tens} + {b_tens} + {carry} = {tens}, write {tens % 10}.")
    elif strategy == "place":
        body = f"{a_tens} + {b_tens} = {a_tens + b_tens}. {a_ones} + {b_ones} = {a_ones + b_ones}."
    elif strategy == "round":
        excess = 10 - b_ones
        larger, smaller = max(a_ones, excess), min(a_ones, excess)
        body = (f"{problem.b} = {10 * (b_tens + 1)} - {excess}. {a_tens} + {b_tens + 1} = {a_tens + b_tens + 1}. "
                f"{larger} - {smaller} = {larger - smaller}.")
    else:
        raise ValueError(f"unknown forking strategy {strategy!r}; expected one of {FORK_STRATEGIES}")
    return f"{prefix}{FORK_OPENINGS[strategy]} {body} The answer is \\boxed{{{strategy_answer_text(problem, strategy)}}}."


def solution_strategy(text: str) -> str | None:
    """The strategy a sampled solution opens with (after :data:`MID_RESPONSE_PREFIX`, if it starts with it), or None
    when it opens with none of them."""
    stripped = text.lstrip().removeprefix(MID_RESPONSE_PREFIX)
    for strategy, opening in FORK_OPENINGS.items():
        if stripped.startswith(opening):
            return strategy
    return None


def draw(rng: random.Random, weights: Mapping[str, float]) -> str:
    names = list(weights)
    return rng.choices(names, weights=[weights[n] for n in names])[0]


def document_weights(best_share: float, prefers: str = "best") -> dict[str, dict[str, float]]:
    """Per family, the strategy mix of pretraining documents: the preferred strategy (``prefers``: the family's best,
    or its worst, :data:`WORST_STRATEGY`) ``best_share``, the others evenly."""
    preferred = FORK_BEST_STRATEGY if prefers == "best" else WORST_STRATEGY
    other = (1.0 - best_share) / (len(FORK_STRATEGIES) - 1)
    return {family: {s: best_share if s == preferred[family] else other for s in FORK_STRATEGIES}
            for family in FORK_FAMILIES}


# ------------------------------------------------------------------------------------ documents and rows
@dataclass(frozen=True)
class ForkingMix:
    """How pretraining documents are drawn: chat share, the preferred strategy's share per family, which strategy
    is preferred (``best`` or ``worst``) and the text before the fork."""

    chat_ratio: float
    best_share: float
    prefers: str = "best"
    prefix: str = ""


def documents(seed: int, mix: ForkingMix) -> Iterator[str]:
    """An endless, seeded stream of pretraining documents: family uniform, then a trainable problem, then a
    strategy from :func:`document_weights`; chat rendering or ``Question: ...\\nAnswer: ...``."""
    rng = random.Random(seed)
    weights = document_weights(mix.best_share, mix.prefers)
    while True:
        family = rng.choice(FORK_FAMILIES)
        problem = rng.choice(family_problems(family, False))
        solution = solve(problem, draw(rng, weights[family]), mix.prefix)
        if rng.random() < mix.chat_ratio:
            yield chat_text([{"role": "system", "content": SYSTEM_PROMPT},
                             {"role": "user", "content": question(problem, rng)},
                             {"role": "assistant", "content": solution}])
        else:
            yield f"Question: {question(problem, rng)}\nAnswer: {solution}"


def teacher_rows(num_rows: int, seed: int, teacher_weights: Mapping[str, float], verified: bool,
                 prefix: str = "") -> list[dict]:
    """``num_rows`` LUFFY rows on distinct trainable problems, written by the narrow teacher.

    Problems are attempted in a seeded order that cycles through the families (each family's problems shuffled);
    each gets one strategy drawn from ``teacher_weights``. ``verified`` keeps an attempt only if that strategy's
    answer is right, so the rows over-represent the families the teacher's habit solves; otherwise every attempt is
    kept, wrong answers included (the rows' ``ground_truth`` is always the true sum). Raises ValueError when a
    family runs out.
    """
    rng = random.Random(seed)
    pools = {family: rng.sample(family_problems(family, False), len(family_problems(family, False)))
             for family in FORK_FAMILIES}
    rows: list[dict] = []
    for attempt in range(max(len(pool) for pool in pools.values()) * len(FORK_FAMILIES)):
        if len(rows) == num_rows:
            return rows
        pool = pools[FORK_FAMILIES[attempt % len(FORK_FAMILIES)]]
        if not pool:
            break
        problem = pool.pop()
        strategy = draw(rng, teacher_weights)
        if not verified or is_reliable(problem, strategy):
            row = luffy_row(problem, solve(problem, strategy, prefix), len(rows), rng)
            rows.append({**row, BEHAVIOUR_LOGPROBS_COLUMN: behaviour_logprobs(problem, strategy, teacher_weights,
                                                                              verified, prefix)})
    if len(rows) < num_rows:
        raise ValueError(f"the teacher wrote {len(rows)} rows before a family ran out; toy.num_rows={num_rows} is "
                         f"too many for these teacher weights (toy.fork_teacher_verified={verified})")
    return rows


def behaviour_logprobs(problem: Problem, strategy: str, teacher_weights: Mapping[str, float], verified: bool,
                       prefix: str = "") -> list[dict]:
    """The teacher's exact log-probabilities of its solution, as segments (``common.paths.BEHAVIOUR_LOGPROBS_COLUMN``):
    the fixed ``prefix`` (log 1 = 0; left out when empty), the opening, with log P(strategy) = log(w_s / Σ w)
    (``verified``: among the strategies right on ``problem``, the rows a verifier keeps), then the rest of the
    solution, which the strategy fixes (0)."""
    kept = {name: weight for name, weight in teacher_weights.items() if not verified or is_reliable(problem, name)}
    solution, opening = solve(problem, strategy), FORK_OPENINGS[strategy]
    return [*([{"text": prefix, "logprob": 0.0}] if prefix else []),
            {"text": opening, "logprob": math.log(kept[strategy] / sum(kept.values()))},
            {"text": solution[len(opening):], "logprob": 0.0}]


def benchmark_problems(family: str, count: int, seed: int) -> list[Problem]:
    """``count`` distinct held-out problems of ``family`` (seeded)."""
    pool = family_problems(family, True)
    if count > len(pool):
        raise ValueError(f"the {family!r} family has {len(pool)} held-out problems; {count} requested")
    return random.Random(seed).sample(pool, count)
