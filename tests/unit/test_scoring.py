"""eval.scoring: the golden table, every benchmark gold, equivalent forms, think handling, time limits on any thread."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from eval.scoring import extract_answer, last_boxed, too_complex, verify

GOLDEN = Path(__file__).resolve().parents[1] / "assets" / "scoring_golden.jsonl"
GOLDEN_ROWS = [json.loads(line) for line in GOLDEN.read_text(encoding="utf-8").splitlines()]
BENCHMARKS = ("aime24", "aime25", "amc", "hmmt25")


@pytest.mark.parametrize("row", GOLDEN_ROWS, ids=[row["why"] for row in GOLDEN_ROWS])
def test_golden_table(row):
    assert verify(row["output"], row["gold"]) == float(row["verdict"])


def test_golden_table_is_balanced():
    verdicts = [row["verdict"] for row in GOLDEN_ROWS]
    assert len(verdicts) >= 40 and 15 <= sum(verdicts) <= len(verdicts) - 15


def _obviously_different(gold: str) -> str:
    return str(int(gold) + 1) if gold.lstrip("-").isdigit() else "987654"


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_every_benchmark_gold_verifies_against_itself_and_not_against_another_number(shared_data, benchmark):
    rows = [json.loads(line) for line in (shared_data / "benchmarks" / f"{benchmark}.jsonl").read_text().splitlines()]
    wrong_self = [r["id"] for r in rows if verify(f"The answer is \\boxed{{{r['answer']}}}.", r["answer"]) != 1.0]
    wrong_other = [r["id"] for r in rows
                   if verify(f"\\boxed{{{_obviously_different(r['answer'])}}}", r["answer"]) != 0.0]
    assert not wrong_self and not wrong_other


@pytest.mark.parametrize("form", ["\\dfrac{1}{576}", "1/576", "\\frac{1}{576}", "\\tfrac{1}{576}"])
def test_equivalent_fraction_forms_agree(form):
    assert verify(f"\\boxed{{{form}}}", "\\frac{1}{576}") == 1.0
    assert verify(f"\\boxed{{{form}}}", "1/576") == 1.0


def test_answer_inside_think_only_does_not_count():
    assert verify("<think>\n\\boxed{5}\n</think>\nno idea", "5") == 0.0
    assert verify("<think>\n\\boxed{5} and thinking went on", "5") == 0.0
    assert verify("<think>\n\\boxed{4}\n</think>\n\\boxed{5}", "5") == 1.0
    assert extract_answer("<think>\n\\boxed{5} and thinking went on") is None


def test_last_boxed_balances_braces():
    assert last_boxed("\\boxed{\\frac{a}{b}} x \\boxed{\\sqrt{\\frac{1}{2}}}") == "\\sqrt{\\frac{1}{2}}"
    assert last_boxed("\\boxed{1} \\boxed{2") == "1"
    assert last_boxed("no box") is None


def test_prefilter_bounds():
    assert too_complex("9^{9^{9^{9}}}") and not too_complex("2^{25} \\cdot 26!")
    assert too_complex("(" * 100 + "1" + ")" * 100) and not too_complex("\\sqrt{\\frac{95}{24}}")
    assert too_complex("1" * 5000)


TIME_LIMIT_S = 2.0
ADVERSARIAL = {
    "tower of four": "\\boxed{9^{9^{9^{9}}}}",
    "tower of three": "\\boxed{9^{9^{9}}}",
    "huge power": "\\boxed{10^{10^{10}}}",
    "huge factorial": "\\boxed{99999999!}",
    "nested brackets": "\\boxed{" + "(" * 3000 + "1" + ")" * 3000 + "}",
    "100k-char answer": "\\boxed{" + "1" * 100_000 + "}",
    "100k chars, no box": "x+" * 50_000,
    "100k unbalanced braces": "\\boxed{" + "{" * 100_000,
}


def _timed(solution: str) -> tuple[float, float]:
    start = time.monotonic()
    verdict = verify(solution, "5", timeout_s=TIME_LIMIT_S)
    return verdict, time.monotonic() - start


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_input_scores_zero_within_the_limit_on_the_main_thread(name):
    assert threading.current_thread() is threading.main_thread()
    verdict, seconds = _timed(ADVERSARIAL[name])
    assert verdict == 0.0 and seconds < TIME_LIMIT_S + 1.5
    assert verify("\\boxed{5}", "5") == 1.0  # a worker killed for overrunning was replaced


def test_adversarial_input_scores_zero_within_the_limit_in_worker_threads():
    results: dict[str, tuple[float, float]] = {}

    def judge(name: str) -> None:
        results[name] = _timed(ADVERSARIAL[name])

    names = ["tower of three", "huge factorial", "nested brackets", "100k-char answer"]
    for name in names:  # one at a time, so each measures its own limit rather than waiting for a free worker
        thread = threading.Thread(target=judge, args=(name,))
        thread.start()
        thread.join()
    assert {name: verdict for name, (verdict, _) in results.items()} == dict.fromkeys(names, 0.0)
    assert max(seconds for _, seconds in results.values()) < TIME_LIMIT_S + 1.5
    correct: list[float] = []
    threads = [threading.Thread(target=lambda: correct.append(verify("\\boxed{\\frac{10}{2}}", "5")))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert correct == [1.0, 1.0, 1.0]
