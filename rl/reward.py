"""The RL reward: verl's custom reward function, judged by the same ``eval.scoring.verify`` as evaluation.

verl loads this file by path (``reward.custom_reward_function.path``) and calls :func:`compute_score` once per
rollout from its reward loop, with ``reward.custom_reward_function.reward_kwargs`` as extra keyword arguments.
The ``dapo`` reward manager adds the overlong penalty to ``score``; ``acc`` is what group filtering compares.
"""
from __future__ import annotations

from typing import Any

from eval.scoring import verify


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, *,
                  correct_score: float = 1.0, incorrect_score: float = -1.0, **kwargs: Any) -> dict[str, float]:
    """``{"score": correct_score if verify(solution, gold) else incorrect_score, "acc": 1.0 or 0.0}``.

    ``data_source`` and ``extra_info`` are accepted for verl's signature; every source is judged the same way.
    """
    correct = verify(solution_str, str(ground_truth)) == 1.0
    return {"score": correct_score if correct else incorrect_score, "acc": 1.0 if correct else 0.0}
