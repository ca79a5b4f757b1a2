"""Data and toy schema checks through Hydra (per-key validation errors are in test_config.py)."""
from __future__ import annotations

import pytest

from common.config import ConfigError, compose


def test_toy_benchmarks_need_the_toy_source_or_a_local_file():
    with pytest.raises(ConfigError, match="data.benchmark_source=toy needs data.source=toy or local"):
        compose(["experiment=demo", "data.source=hub"])
    cfg = compose(["experiment=demo", "data.source=local", "data.path=x.jsonl", "data.row_format=chat"])
    assert (cfg.data.benchmark_source, cfg.data.row_format) == ("toy", "chat")


def test_a_row_format_needs_rows_read_from_a_file_or_the_hub():
    with pytest.raises(ConfigError, match="data.row_format=alpaca converts rows read from a file or the hub"):
        compose(["experiment=demo", "data.row_format=alpaca"])
    with pytest.raises(ConfigError, match="data.row_format"):
        compose(["experiment=demo", "data.source=local", "data.path=x.jsonl", "data.row_format=sharegpt"])


def test_toy_profile_defaults():
    cfg = compose(["experiment=table1", "profile=toy"])
    assert (cfg.data.source, cfg.data.num_sft_rows, cfg.data.num_rl_val_rows) == ("toy", 1000, 32)
    assert sorted(cfg.data.benchmarks) == ["toy_add", "toy_mixed"]
    assert cfg.toy.hidden_size == 128 and cfg.toy.num_heads == 2


def test_local_benchmarks_need_benchmark_dir_and_it_has_no_default():
    """data=openr1_local names no folder outside the repository: without data.benchmark_dir the one-line error names
    the key and the fix; with it, the folder given is the one read."""
    local = ["experiment=table1", "profile=paper", "data=openr1_local", "data.path=rows.parquet"]
    with pytest.raises(ConfigError) as error:
        compose(local)
    message = str(error.value)
    assert message.startswith("data.benchmark_dir must be set for data.benchmark_source=local")
    assert "add data.benchmark_dir=<folder of the benchmark JSONL files>" in message and "\n" not in message
    assert compose([*local, "data.benchmark_dir=/data/benchmarks"]).data.benchmark_dir == "/data/benchmarks"
