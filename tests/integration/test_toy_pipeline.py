"""The toy data path end to end at a tiny scale: base model pretraining, data.prepare, data.tokenize_sft.

The base model gets 20 pretraining steps (seconds), so these tests check contracts, not accuracy.
"""
from __future__ import annotations

import json

import pytest

from common.config import compose
from common.manifest import read_manifest
from common.paths import base_model_path, data_dir, sft_tokens_path, tokens_dir, toy_base_dir

pytestmark = pytest.mark.integration

TINY = ["toy.pretrain_steps=20", "toy.pretrain_batch_size=4", "toy.pretrain_seq_len=128", "toy.num_pretrain_docs=500",
        "toy.pretrain_eval_problems=4", "toy.num_rows=200", "toy.num_benchmark_problems=10",
        "data.num_sft_rows=50", "data.num_rl_val_rows=8",
        "data.benchmarks.toy_add.expected_count=10", "data.benchmarks.toy_mixed.expected_count=10",
        "logging.progress=false"]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return compose(["experiment=table1", "profile=toy", f"experiment.run_root={root}", *TINY])


@pytest.fixture(scope="module")
def base(cfg):
    from toy import base as base_stage

    return base_stage.run(cfg)


@pytest.fixture(scope="module")
def prepared(cfg):
    from data import prepare

    return prepare.run(cfg)


def test_base_model_loads_with_transformers_and_generates(cfg, base):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    assert base.complete and base.metrics["steps"] == 20
    path = base_model_path(cfg)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token_id == im_end == model.config.eos_token_id
    assert GenerationConfig.from_pretrained(path).eos_token_id == im_end
    assert model.config.head_dim == 64 and model.config.model_type == "qwen3"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Compute 2 + 3."}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert output.shape[1] > prompt["input_ids"].shape[1]
    losses = [json.loads(line)["loss"] for line in open(toy_base_dir(cfg) / "metrics.jsonl") if '"loss"' in line]
    assert len(losses) == 20 and losses[-1] < losses[0]


def test_base_stage_is_cached_by_config_hash(cfg, base):
    from toy import base as base_stage

    again = base_stage.run(cfg)
    assert again.run_id == base.run_id and again.config_hash == base.config_hash


def test_prepare_writes_disjoint_split_and_verl_rows(cfg, prepared):
    import pyarrow.parquet as pq

    split = prepared.details["split"]
    assert split["counts"] == {"sft": 50, "rl": 142, "rl_val": 8}
    assert set(split["problem_overlap"].values()) == {0}
    rl = pq.read_table(data_dir(cfg) / "rl.parquet")
    assert rl.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    row = rl.slice(0, 1).to_pylist()[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert set(row["reward_model"]) == {"style", "ground_truth"} and set(row["extra_info"]) == {"index", "split"}
    bench = [json.loads(line) for line in open(data_dir(cfg) / "benchmarks" / "toy_mixed.jsonl")]
    assert len(bench) == 10 and set(bench[0]) == {"id", "problem", "answer", "answer_raw", "prompt"}
    assert bench[0]["prompt"][0]["content"].startswith("Please reason step by step")


def test_rl_parquet_loads_in_verls_dataset(cfg, base, prepared, tmp_path):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tokenizer = AutoTokenizer.from_pretrained(base_model_path(cfg))
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 96, "truncation": "error",
                               "filter_overlong_prompts": True, "filter_overlong_prompts_workers": 1,
                               "cache_dir": str(tmp_path)})
    dataset = RLHFDataset(str(data_dir(cfg) / "rl_val.parquet"), tokenizer, config)
    assert len(dataset) == 8
    item = dataset[0]
    assert item["data_source"] == "toy" and item["reward_model"]["style"] == "rule"


def test_tokenize_sft_masks_the_prompt(cfg, base, prepared):
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from data import tokenize_sft

    manifest = tokenize_sft.run(cfg)
    assert manifest.complete and manifest.details["num_examples"] == 50
    tokens = pq.read_table(sft_tokens_path(cfg)).to_pylist()
    sft_rows = {r["row_id"]: r for r in pq.read_table(data_dir(cfg) / "sft.parquet").to_pylist()}
    tokenizer = AutoTokenizer.from_pretrained(base_model_path(cfg))
    for example in tokens[:5]:
        response = [t for t in example["labels"] if t != -100]
        assert len(response) == example["num_response_tokens"] > 0
        assert example["labels"][-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        target = sft_rows[example["row_id"]]["target"][0]["content"]
        assert tokenizer.decode(response) == target + "<|im_end|>"
    inputs = read_manifest(tokens_dir(cfg)).inputs  # the data run and the base model, by run id and outputs
    assert inputs["sft_rows"]["run_id"] and inputs["sft_rows"]["outputs"] and inputs["base_model"]["run_id"]
