"""The RL reward: verl loads it through its own loader; verdicts on real benchmark answers; the score scale."""
from __future__ import annotations

import json

from omegaconf import OmegaConf

from rl.reward import compute_score
from rl.verl_args import REWARD_FILE


def _benchmark(shared_data, name: str) -> list[dict]:
    with open(shared_data / "benchmarks" / f"{name}.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_verl_loads_our_reward_through_its_loader():
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": str(REWARD_FILE), "name": "compute_score",
        "reward_kwargs": {"correct_score": 1.0, "incorrect_score": 0.0}}}})
    reward_fn = get_custom_reward_fn(config)
    # verl's wrapper adds reward_kwargs: zero_one scale here
    assert reward_fn(data_source="aime", solution_str="so \\boxed{204}", ground_truth="204",
                     extra_info={"index": 0}) == {"score": 1.0, "acc": 1.0}
    assert reward_fn(data_source="aime", solution_str="so \\boxed{205}", ground_truth="204") == \
        {"score": 0.0, "acc": 0.0}


def test_real_benchmark_answers(shared_data):
    hmmt = {row["id"]: row["answer"] for row in _benchmark(shared_data, "hmmt25")}
    amc = _benchmark(shared_data, "amc")
    aime24 = _benchmark(shared_data, "aime24")
    gold_frac = hmmt["hmmt25-feb-03"]  # \frac{1}{576}
    cases = [
        # (solution, gold, correct?)
        (f"Thus the answer is \\boxed{{{aime24[0]['answer']}}}.", aime24[0]["answer"], True),  # 204
        ("<think>maybe \\boxed{204}</think> The walk takes \\boxed{205} minutes.", aime24[0]["answer"], False),
        ("\\boxed{\\dfrac{1}{576}}", gold_frac, True),  # same value, different LaTeX
        ("\\boxed{0.5}", gold_frac, False),
        ("First \\boxed{2}; corrected: \\boxed{1-\\frac{2}{\\pi}}", hmmt["hmmt25-feb-08"], True),  # last box
        (f"\\boxed{{{amc[0]['answer']}}}", amc[0]["answer"], True),
        (f"The answer is {aime24[1]['answer']}.", aime24[1]["answer"], False),  # no box
    ]
    for solution, gold, correct in cases:
        assert compute_score("benchmark", solution, gold) == \
            {"score": 1.0 if correct else -1.0, "acc": 1.0 if correct else 0.0}, solution
