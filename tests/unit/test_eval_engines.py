"""Data-parallel evaluation settings: how many engines, on which GPUs, and that the count is not part of any run id."""
from __future__ import annotations

import pytest

from eval.sample import Completion, engine_count, visible_gpus
from common import preflight
from common.config import ConfigError, compose
from common.paths import eval_run
from common.grid import report_run


def test_engine_count_uses_every_visible_gpu_when_zero(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7,8")
    assert visible_gpus() == ["4", "5", "6", "7", "8"]
    paper = ["profile=paper", "eval.data_parallel_size=0"]
    assert engine_count(compose(paper)) == 5
    assert engine_count(compose([*paper, "eval.tensor_parallel_size=2"])) == 2  # 5 // 2; the fifth GPU idles
    assert engine_count(compose(["profile=paper", "eval.data_parallel_size=3"])) == 3
    with pytest.raises(ConfigError, match=r"eval.data_parallel_size=3 engines x eval.tensor_parallel_size=2 .* 6 GPUs"):
        engine_count(compose(["profile=paper", "eval.data_parallel_size=3", "eval.tensor_parallel_size=2"]))


def test_engine_count_on_cpu_is_the_setting_or_one():
    assert engine_count(compose(["profile=toy", "eval.data_parallel_size=0"])) == 1
    assert engine_count(compose(["profile=toy", "eval.data_parallel_size=2"])) == 2
    with pytest.raises(ConfigError, match="eval.data_parallel_size"):
        compose(["eval.data_parallel_size=-1"])


def test_preflight_counts_every_engine_gpu():
    cfg = compose(["profile=paper", "eval.tensor_parallel_size=2", "eval.data_parallel_size=4"])
    assert preflight.gpus_needed(cfg, "eval_sft") == 8
    assert preflight.gpus_needed(compose(["profile=paper", "eval.data_parallel_size=0"]), "eval_rl") == 1


def test_engine_count_is_not_part_of_the_eval_or_report_identity():
    one, four = (compose(["profile=toy", f"eval.data_parallel_size={n}"]) for n in (1, 4))
    assert eval_run(one, "sft", "base", "toy_add", None) == eval_run(four, "sft", "base", "toy_add", None)
    assert report_run(one).config == report_run(four).config
    other_n = compose(["profile=toy", "eval.n=4"])
    assert report_run(other_n).config != report_run(one).config  # the report still tracks the protocol


class FakeEngine:
    """An engine process's interface (``eval.sample._EngineProcess``): answers the load with a ready reply and each
    ``sample`` request with completions that are a function of the prompt and its seed alone, as vLLM's per-request
    seeds make them; records what it was sent and its environment."""

    def __init__(self, index: int, env: dict):
        self.index, self.env, self.prompts, self._reply = index, env, [], None

    def send(self, message):
        if message[0] == "sample":
            prompts, seeds, n = message[1]
            self.prompts += prompts
            self._reply = [[Completion(f"{prompt}/{seed}/{i}", 1, "stop") for i in range(n)]
                           for prompt, seed in zip(prompts, seeds)]
        else:
            self._reply = ("fake", "0", {})

    def receive(self):
        return self._reply

    def stop(self, kill=False):
        pass


def fake_pool(monkeypatch, engines: int, *overrides: str):
    from eval import sample

    monkeypatch.setattr(sample, "_EngineProcess", FakeEngine)
    cfg = compose(["profile=toy", "eval.problems_per_batch=16", f"eval.data_parallel_size={engines}", *overrides])
    return sample.EnginePool("model", cfg, max_model_len=64, engines=engines)


def test_a_30_problem_benchmark_gives_every_one_of_8_engines_work_and_the_same_samples(monkeypatch):
    """eval.run hands the pool problems_per_batch x engines = 128 problems per call; AIME's 30 used to go out 16 at a
    time, to engines 0 and 1 alone."""
    pool = fake_pool(monkeypatch, 8)
    prompts, seeds = [[index] for index in range(30)], list(range(100, 130))
    samples = pool.sample(prompts, seeds, n=2)
    assert [len(engine.prompts) for engine in pool._workers] == [4, 4, 4, 4, 4, 4, 3, 3]
    assert [prompt for engine in pool._workers for prompt in engine.prompts] == prompts  # consecutive chunks
    assert [[c.text for c in row] for row in samples] == [[f"{p}/{s}/{i}" for i in range(2)]
                                                          for p, s in zip(prompts, seeds)]  # prompt order, seeds kept


def test_engine_chunks_stay_within_problems_per_batch_and_balanced():
    from eval.sample import engine_chunks

    sizes = lambda count, engines, most: [c.stop - c.start for c in engine_chunks(count, engines, most)]  # noqa: E731
    assert sizes(30, 8, 16) == [4, 4, 4, 4, 4, 4, 3, 3]
    assert sizes(128, 8, 16) == [16] * 8
    assert sizes(83, 8, 16) == [11, 11, 11, 10, 10, 10, 10, 10]  # AMC
    assert sizes(5, 8, 16) == [1] * 5
    assert sizes(130, 8, 16) == [9, 9] + [8] * 14
    assert sizes(0, 8, 16) == []


def test_every_engine_compiles_into_caches_of_its_own(monkeypatch, tmp_path):
    """Engines that compile at once must not share vLLM's torch.compile cache (vllm-project/vllm#24601)."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    pool = fake_pool(monkeypatch, 3)
    roots = [engine.env["VLLM_CACHE_ROOT"] for engine in pool._workers]
    assert roots == [str(tmp_path / "vllm" / f"engine_{index}") for index in range(3)]
    for engine, root in zip(pool._workers, roots):
        assert engine.env["TORCHINDUCTOR_CACHE_DIR"].startswith(root)
        assert engine.env["TRITON_CACHE_DIR"].startswith(root)
