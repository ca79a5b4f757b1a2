"""What the evaluation tests share: a sampler whose completions are scripted per seed."""
from __future__ import annotations

from eval.sample import Completion


class ScriptedSampler:
    """Returns fixed completions (the sampler interface, for checking verdicts and metrics by hand)."""

    backend, version, settings = "scripted", "0", {}

    def __init__(self, texts_by_seed: dict[int, list[str]]):
        self.texts_by_seed = texts_by_seed

    def sample(self, prompts, seeds, n, finished=None):
        return [[Completion(text, 5, "stop") for text in self.texts_by_seed[seed]] for seed in seeds]

    def close(self):
        pass
