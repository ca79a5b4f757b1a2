"""Data-parallel evaluation settings: how many engines, on which GPUs, and that the count is not part of any run id."""
from __future__ import annotations

import pytest

from eval.sample import engine_count, visible_gpus
from common import preflight
from common.config import ConfigError, compose
from common.paths import eval_run, report_run


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
