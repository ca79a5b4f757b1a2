"""SFT on GPUs, two optimiser steps per method under FSDP2/NCCL (bf16 mixed precision, the paper profile) on a
random Qwen3 with the real Qwen3 vocabulary (151,936 rows: the loss head's memory and chunking at full width),
then the verified HF export and an independent HF log-prob check of that export. Imports neither vLLM nor verl."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bench.tiny_model import build_tiny_tokenizer, random_qwen3
from common.config import compose
from common.manifest import read_manifest
from common.models import load_causal_lm, load_tokenizer
from common.paths import hf_export_dir, sft_dir

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make test-gpu)")]

QWEN3_VOCAB = 151_936
METHODS = ["sft", "dft", "iwsft", "psft", "asft", "eksft"]
STEPS = 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """4 layers, hidden 256 (4 heads x 64), bf16 weights, the ChatML test tokenizer; embedding and head rows
    beyond the tokenizer's ids are never labels but are computed in every softmax, as with the real model."""
    folder = tmp_path_factory.mktemp("qwen3_full_vocab")
    tokenizer = build_tiny_tokenizer()
    tokenizer.save_pretrained(folder)
    model = random_qwen3(vocab_size=QWEN3_VOCAB, hidden_size=256, num_layers=4, intermediate_size=512,
                         max_position_embeddings=1024, dtype="bfloat16", seed=0,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    return folder


def overrides(run_root: Path, model_dir: Path, method: str, nproc: int) -> list[str]:
    return ["profile=paper", f"profile.nproc_per_node={nproc}", f"sft/method={method}",
            f"experiment.run_root={run_root}", "experiment.name=gpu_smoke", "model.source=hub",
            f"model.path={model_dir}", "model.name=qwen3_full_vocab", "logging.progress=false",
            "sft.micro_batch_size=2", "sft.grad_accum=1", f"sft.max_steps={STEPS}", "sft.checkpoint_every=0",
            "sft.warmup_ratio=0"]


@pytest.mark.parametrize("method", METHODS)
def test_two_fsdp2_nccl_steps_then_a_verified_export(tmp_path, model_dir, method):
    from sft_helpers import run_torchrun, write_sft_tokens

    nproc = min(2, torch.cuda.device_count())
    args = overrides(tmp_path, model_dir, method, nproc)
    cfg = compose(args)
    write_sft_tokens(cfg, num_rows=4 * nproc * STEPS)
    result = run_torchrun(args, nproc=nproc, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    manifest = read_manifest(sft_dir(cfg))
    assert manifest.complete and manifest.metrics["steps"] == STEPS
    export = manifest.details["export"]
    assert export["max_abs_logprob_diff"] <= export["tolerance"]
    assert all(math.isfinite(value) for value in manifest.metrics.values() if isinstance(value, float))

    # the export, loaded by plain transformers on one GPU: full-vocabulary log-probs of a chat that sum to 1
    folder = hf_export_dir(sft_dir(cfg))
    tokenizer = load_tokenizer(folder)
    model = load_causal_lm(folder, dtype="bfloat16", attn_implementation=cfg.model.attn_implementation).cuda()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "one two"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"].cuda()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
    assert logprobs.shape[-1] == QWEN3_VOCAB
    torch.testing.assert_close(logprobs.exp().sum(-1), torch.ones(ids.shape), rtol=0, atol=1e-3,
                               check_device=False)

