"""The sampled-token entropy estimate of vLLM evaluation: requesting the sampled token's log-probability leaves the
samples unchanged, and ``neg_logprob_sum`` is ``−Σ log p`` under the tempered distribution the token was drawn from."""
from __future__ import annotations

import math

import pytest
import torch

from bench.tiny_model import build_tiny_qwen3
from eval.sample import VLLMSampler
from common.config import compose
from common.models import load_causal_lm

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
TEMPERATURE = 0.7


def test_logprobs_leave_samples_unchanged_and_match_the_tempered_model(tmp_path, monkeypatch):
    vllm = pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm_cache"))
    model = build_tiny_qwen3(tmp_path / "tiny", dtype="float32")
    cfg = compose([f"experiment.run_root={tmp_path}", "data=openr1_local", "data.path=unused.parquet",
                   "data.benchmark_dir=unused", f"eval.model_path={model}", "eval.variant=tiny",
                   f"eval.temperature={TEMPERATURE}", "eval.max_tokens=12", "model.dtype=float32",
                   "eval.kv_cache_memory_bytes=67108864"])
    sampler = VLLMSampler(str(model), cfg, max_model_len=64)
    prompts, seeds = [[5, 6, 7, 8], [9, 10, 11]], [11, 12]

    def generate(**logprobs):
        params = [vllm.SamplingParams(n=4, seed=seed, temperature=TEMPERATURE, top_p=1.0, max_tokens=12, **logprobs)
                  for seed in seeds]
        return sampler._llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)

    with_logprobs, plain = generate(logprobs=0), generate()
    assert [[c.token_ids for c in out.outputs] for out in with_logprobs] == \
        [[c.token_ids for c in out.outputs] for out in plain]
    assert all(c.cumulative_logprob is None for out in plain for c in out.outputs)
    completions = sampler.sample(prompts, seeds, 4)
    assert [[(c.text, c.num_tokens) for c in cs] for cs in completions] == \
        [[(c.text, len(c.token_ids)) for c in out.outputs] for out in with_logprobs]
    sampler.close()

    hf = load_causal_lm(str(model), dtype="float32").eval()
    for ids, out, cs in zip(prompts, with_logprobs, completions):
        for c, completion in zip(out.outputs, cs):
            tokens = torch.tensor([ids + list(c.token_ids)])
            with torch.no_grad():
                logits = hf(tokens).logits[0, len(ids) - 1:-1].float()
            expected = -(logits / TEMPERATURE).log_softmax(-1).gather(1, tokens[0, len(ids):, None]).sum().item()
            assert math.isfinite(completion.neg_logprob_sum) and completion.neg_logprob_sum > 0
            assert completion.neg_logprob_sum == pytest.approx(expected, rel=1e-3, abs=1e-3)
