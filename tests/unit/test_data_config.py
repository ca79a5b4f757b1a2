"""Data and toy schema validation through Hydra: every error names the key."""
from __future__ import annotations

import pytest

from pipeline.config import ConfigError, compose


@pytest.mark.parametrize("override, key", [
    ("data.num_sft_rows=0", "data.num_sft_rows"),
    ("data.strip_leading_think=sometimes", "data.strip_leading_think"),
    ("data.invalid_rows=ignore", "data.invalid_rows"),
    ("data.num_rl_val_rows=-1", "data.num_rl_val_rows"),
    ("toy.slip_rates.chain=1.5", "toy.slip_rates.chain"),
    ("+toy.chat_style_weights.guess=0.1", "toy.chat_style_weights"),
    ("toy.num_kv_heads=3", "toy.num_kv_heads"),
    ("toy.pretrain_seq_len=4096", "toy.pretrain_seq_len"),
])
def test_validation_error_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose(["experiment=demo", override])


def test_toy_benchmarks_need_the_toy_source():
    with pytest.raises(ConfigError, match="data.benchmark_source=toy needs data.source=toy"):
        compose(["experiment=demo", "data.source=local", "data.path=x.parquet"])


def test_toy_profile_defaults():
    cfg = compose(["experiment=demo", "profile=toy"])
    assert (cfg.data.source, cfg.data.num_sft_rows, cfg.data.num_rl_val_rows) == ("toy", 1000, 32)
    assert sorted(cfg.data.benchmarks) == ["toy_add", "toy_mixed"]
    assert cfg.toy.hidden_size == 128 and cfg.toy.num_heads == 2
