"""The toy arithmetic world: problems, worked solutions in four styles, LUFFY rows and pretraining documents.

A problem is a sum/difference of ``min_terms``..``max_terms`` terms. A term is a number 1-20 (50%), a product
``a * b`` with a, b in 2-9 (35%) or a group ``(a ± b) * c`` with 1 ≤ b < a ≤ 12 and c in 2-5 (15%), so every
term is positive and only the running sum can go negative. The answer is the integer value.

Solutions come in four styles that differ in how reliable they are, so that RL can raise pass@1 by re-weighting
strategies instead of having to learn new arithmetic (docs/toy_world.md):

* ``chain``    rewrites the whole expression after each reduction: ``3 - 7 * 4 + 5 = 3 - 28 + 5 = ... = -20.``
               (common; pretraining copies slip, ``toy.slip_rates``)
* ``steps``    one sentence per operation: ``7 * 4 = 28. 3 - 28 = -25. -25 + 5 = -20.`` (common; slips too; the
               style the 0.84M base model executes best, so the one RL up-weights)
* ``careful``  one line per operation followed by its inverse check; a slip is caught by the check and corrected
               on the spot, so the final answer is always right (rare in pretraining)
* ``direct``   only the answer, usually wrong in pretraining documents (a guessing mode)

Every solution ends with ``The answer is \\boxed{N}.``. Problems whose expression hashes to 0 mod 10 (md5) are
held out: no training document or row ever contains them; the toy benchmarks are drawn from them.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Iterator, Mapping

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
"""The toy world's system turn (the same sentence MathArena uses)."""
DATA_SOURCE = "toy"
STYLES = ("chain", "steps", "careful", "direct")
CAREFUL_OPENING = "Let me compute one step at a time and check each result."
PHRASINGS = ("Compute {expr}.", "What is {expr}?", "Evaluate: {expr}", "Calculate the value of {expr}.")
SLIP_DELTAS = (-10, -2, -1, 1, 2, 10)
INVERSE_OP = {"+": "-", "-": "+"}
HELD_OUT_MODULUS = 10


@dataclass(frozen=True)
class Term:
    """One additive term: ``kind`` is number, product or group; ``operands`` are its numbers in reading order."""

    kind: str
    operands: tuple[int, ...]
    group_op: str = ""
    """``+`` or ``-`` inside a group ``(a ± b) * c``."""

    @property
    def text(self) -> str:
        if self.kind == "number":
            return str(self.operands[0])
        if self.kind == "product":
            return f"{self.operands[0]} * {self.operands[1]}"
        a, b, c = self.operands
        return f"({a} {self.group_op} {b}) * {c}"


@dataclass(frozen=True)
class Problem:
    """``terms[0] signs[0] terms[1] signs[1] ...`` with signs in {+, -}."""

    terms: tuple[Term, ...]
    signs: tuple[str, ...]

    @property
    def expression(self) -> str:
        parts = [self.terms[0].text]
        for sign, term in zip(self.signs, self.terms[1:]):
            parts.append(f"{sign} {term.text}")
        return " ".join(parts)

    @property
    def answer(self) -> int:
        return reduce_problem(self)[-1].result

    @property
    def is_additive(self) -> bool:
        """Only plain numbers (the ``toy_add`` benchmark)."""
        return all(term.kind == "number" for term in self.terms)

    @property
    def held_out(self) -> bool:
        return is_held_out(self.expression)


@dataclass(frozen=True)
class Step:
    """One operation ``left op right = result`` and the expression after it (for the chain style)."""

    left: int
    op: str
    right: int
    result: int
    expression_after: str
    in_term: bool
    """Part of a compound term (its result must stay positive when slipped)."""


def is_held_out(expression: str) -> bool:
    """md5(expression) mod 10 == 0: evaluation-only problems."""
    return int(hashlib.md5(expression.encode()).hexdigest(), 16) % HELD_OUT_MODULUS == 0


def _apply(left: int, op: str, right: int) -> int:
    return left + right if op == "+" else left - right if op == "-" else left * right


def _render(items: list[str], signs: tuple[str, ...]) -> str:
    parts = [items[0]] + [f"{sign} {item}" for sign, item in zip(signs, items[1:])]
    return " ".join(parts)


def reduce_problem(problem: Problem, slip_step: int | None = None, slip_delta: int = 0) -> list[Step]:
    """Every operation in evaluation order: compound terms left to right, then the sum left to right.

    With ``slip_step`` set, that step's result is off by ``slip_delta`` and later steps use the wrong value
    (the slip propagates to the final answer).
    """
    items = [term.text for term in problem.terms]
    values: list[int] = []
    steps: list[Step] = []

    def record(left: int, op: str, right: int) -> int:
        result = _apply(left, op, right)
        if slip_step == len(steps):
            result += slip_delta
        return result

    for index, term in enumerate(problem.terms):
        if term.kind == "number":
            values.append(term.operands[0])
            continue
        if term.kind == "group":
            a, b, c = term.operands
            inner = record(a, term.group_op, b)
            items[index] = f"{inner} * {c}"
            steps.append(Step(a, term.group_op, b, inner, _render(items, problem.signs), True))
            left, right = inner, c
        else:
            left, right = term.operands
        product = record(left, "*", right)
        items[index] = str(product)
        steps.append(Step(left, "*", right, product, _render(items, problem.signs), True))
        values.append(product)

    total = values[0]
    for position, (sign, value) in enumerate(zip(problem.signs, values[1:]), start=1):
        new_total = record(total, sign, value)
        rest = _render([str(new_total)] + [str(v) for v in values[position + 1:]], problem.signs[position:])
        steps.append(Step(total, sign, value, new_total, rest, False))
        total = new_total
    if not steps:  # a single number cannot occur (min_terms >= 2), but keep the contract total
        raise ValueError(f"problem {problem.expression!r} has no operation")
    return steps


# ------------------------------------------------------------------------------------------- sampling
def sample_term(rng: random.Random) -> Term:
    draw = rng.random()
    if draw < 0.5:
        return Term("number", (rng.randint(1, 20),))
    if draw < 0.85:
        return Term("product", (rng.randint(2, 9), rng.randint(2, 9)))
    a = rng.randint(2, 12)
    op = rng.choice("+-")
    b = rng.randint(1, min(9, a - 1)) if op == "-" else rng.randint(1, 9)
    return Term("group", (a, b, rng.randint(2, 5)), op)


def sample_problem(rng: random.Random, min_terms: int, max_terms: int) -> Problem:
    num_terms = rng.randint(min_terms, max_terms)
    terms = tuple(sample_term(rng) for _ in range(num_terms))
    signs = tuple(rng.choice("+-") for _ in range(num_terms - 1))
    return Problem(terms, signs)


def sample_problems(rng: random.Random, count: int, min_terms: int, max_terms: int, *,
                    held_out: bool, additive: bool | None = None, exclude: set[str] | None = None) -> list[Problem]:
    """``count`` distinct problems, all held out or all trainable; ``additive`` filters numbers-only problems."""
    seen = set(exclude or ())
    problems: list[Problem] = []
    attempts = 0
    while len(problems) < count:
        attempts += 1
        if attempts > 1000 * count + 100000:
            raise ValueError(f"could not draw {count} distinct problems (held_out={held_out}, additive={additive}, "
                             f"terms {min_terms}-{max_terms}); the space is too small")
        problem = sample_problem(rng, min_terms, max_terms)
        if problem.held_out != held_out or (additive is not None and problem.is_additive != additive):
            continue
        if problem.expression in seen:
            continue
        seen.add(problem.expression)
        problems.append(problem)
    return problems


def sample_style(rng: random.Random, weights: Mapping[str, float]) -> str:
    names = list(weights)
    return rng.choices(names, weights=[weights[n] for n in names])[0]


def _slip(rng: random.Random, steps: list[Step]) -> tuple[int, int]:
    """A random step and a delta that keeps compound-term results positive."""
    index = rng.randrange(len(steps))
    deltas = [d for d in SLIP_DELTAS if steps[index].result + d > 0 or not steps[index].in_term]
    return index, rng.choice(deltas)


# ------------------------------------------------------------------------------------------ rendering
def final_sentence(answer: int) -> str:
    return f"The answer is \\boxed{{{answer}}}."


def solve(problem: Problem, style: str, rng: random.Random, *, slip_rate: float = 0.0,
          direct_error_rate: float = 0.0) -> str:
    """A worked solution in ``style``; with probability ``slip_rate`` it contains one arithmetic slip.

    In ``chain``/``steps`` a slip propagates to a wrong answer; in ``careful`` the check exposes it and the line
    is redone, so the answer stays right. ``direct`` gives a wrong answer with probability ``direct_error_rate``.
    """
    if style == "direct":
        answer = problem.answer
        if rng.random() < direct_error_rate:
            answer += rng.choice(SLIP_DELTAS)
        return final_sentence(answer)
    clean = reduce_problem(problem)
    slip_step, slip_delta = _slip(rng, clean) if rng.random() < slip_rate else (None, 0)
    if style == "careful":
        lines = [CAREFUL_OPENING]
        for index, step in enumerate(clean):
            if index == slip_step:
                wrong = step.result + slip_delta
                lines.append(f"{step.left} {step.op} {step.right} = {wrong}. Check: {_check(wrong, step)}. "
                             f"No match, redo: {step.left} {step.op} {step.right} = {step.result}. "
                             f"Check: {_check(step.result, step)}.")
            else:
                lines.append(f"{step.left} {step.op} {step.right} = {step.result}. "
                             f"Check: {_check(step.result, step)}.")
        lines.append(final_sentence(clean[-1].result))
        return "\n".join(lines)
    steps = reduce_problem(problem, slip_step, slip_delta) if slip_step is not None else clean
    if style == "chain":
        body = " = ".join([problem.expression] + [step.expression_after for step in steps]) + "."
    elif style == "steps":
        body = " ".join(f"{s.left} {s.op} {s.right} = {s.result}." for s in steps)
    else:
        raise ValueError(f"unknown solution style {style!r}; expected one of {STYLES}")
    return f"{body} {final_sentence(steps[-1].result)}"


def _check(result: int, step: Step) -> str:
    """``result ∓ right = x`` for a sum (x == left iff result is right); ``right * left = x`` for a product
    (x == result iff result is right)."""
    if step.op == "*":
        return f"{step.right} * {step.left} = {step.left * step.right}"
    inverse = INVERSE_OP[step.op]
    return f"{result} {inverse} {step.right} = {_apply(result, inverse, step.right)}"


def question(problem: Problem, rng: random.Random) -> str:
    return rng.choice(PHRASINGS).format(expr=problem.expression)


def chat_text(messages: list[dict[str, str]]) -> str:
    """The toy chat template rendered in Python (identical to ``tokenizer.CHAT_TEMPLATE``; a unit test checks it)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


# ----------------------------------------------------------------------------------------- LUFFY rows
def luffy_row(problem: Problem, solution: str, index: int, rng: random.Random) -> dict:
    """One training row in the LUFFY schema (the same columns as OpenR1-Math-46k-8192)."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                   {"role": "user", "content": question(problem, rng)}],
        "target": [{"role": "assistant", "content": solution}],
        "ability": "math",
        "reward_model": {"ground_truth": str(problem.answer), "style": "rule"},
        "extra_info": {"index": index, "split": "default"},
    }


def training_rows(num_rows: int, seed: int, min_terms: int, max_terms: int,
                  style_weights: Mapping[str, float]) -> list[dict]:
    """``num_rows`` distinct trainable problems with clean (slip-free) solutions, styles drawn by weight."""
    rng = random.Random(seed)
    problems = sample_problems(rng, num_rows, min_terms, max_terms, held_out=False)
    return [luffy_row(p, solve(p, sample_style(rng, style_weights), rng), i, rng) for i, p in enumerate(problems)]


def benchmark_problems(kind: str, count: int, seed: int, min_terms: int, max_terms: int) -> list[Problem]:
    """Held-out problems: ``add`` (numbers only) or ``mixed`` (at least one product or group)."""
    if kind not in ("add", "mixed"):
        raise ValueError(f"unknown toy benchmark kind {kind!r}; expected add or mixed")
    rng = random.Random(seed)
    return sample_problems(rng, count, min_terms, max_terms, held_out=True, additive=(kind == "add"))


# -------------------------------------------------------------------------------- pretraining documents
@dataclass(frozen=True)
class DocumentMix:
    """How pretraining documents are drawn."""

    chat_ratio: float
    chat_style_weights: Mapping[str, float]
    raw_style_weights: Mapping[str, float]
    slip_rates: Mapping[str, float]
    direct_error_rate: float
    min_terms: int
    max_terms: int


def documents(seed: int, mix: DocumentMix) -> Iterator[str]:
    """An endless, seeded stream of pretraining documents over trainable (never held-out) problems.

    A chat document is the full chat rendering (system, user, assistant); a raw one is
    ``Question: ...\\nAnswer: ...``.
    """
    rng = random.Random(seed)
    while True:
        problem = sample_problem(rng, mix.min_terms, mix.max_terms)
        if problem.held_out:
            continue
        chat = rng.random() < mix.chat_ratio
        style = sample_style(rng, mix.chat_style_weights if chat else mix.raw_style_weights)
        solution = solve(problem, style, rng, slip_rate=mix.slip_rates.get(style, 0.0),
                         direct_error_rate=mix.direct_error_rate)
        if chat:
            yield chat_text([{"role": "system", "content": SYSTEM_PROMPT},
                             {"role": "user", "content": question(problem, rng)},
                             {"role": "assistant", "content": solution}])
        else:
            yield f"Question: {question(problem, rng)}\nAnswer: {solution}"


def solution_style(text: str) -> str:
    """Which style a sampled solution is in (for per-style statistics)."""
    stripped = text.lstrip()
    if stripped.startswith(CAREFUL_OPENING[:20]):
        return "careful"
    if stripped.startswith("The answer is"):
        return "direct"
    first_sentence = stripped.split(".", 1)[0]
    return "chain" if first_sentence.count("=") > 1 else "steps"
