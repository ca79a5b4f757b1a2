"""vLLM vs transformers ``generate`` throughput on the same model and workload, in one run; prints the ratio.

    python -m bench.vllm_vs_hf                         # builds a tiny random Qwen3 (hidden 256, 4 layers) in a tmp dir
    python -m bench.vllm_vs_hf --model /path/to/hf --device cuda --prompts 64 --n 32 --max-tokens 1024

Both sides run the evaluation stage's own samplers (``eval.sample.VLLMSampler`` and ``HFSampler``): P chat prompts x
n samples at temperature 1.0, top-p 1.0, one seed per prompt. On CPU each side gets one thread (vLLM in-process
with ``OMP_NUM_THREADS=1``, HF with ``torch.set_num_threads(1)``), as docs/evaluation.md describes. Tokens
are generated tokens up to and including EOS; the ratio is (vLLM tokens/s) / (HF tokens/s), measured back to back.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time


def _config(model: str, args: argparse.Namespace):
    from common.config import compose

    return compose([f"eval.model_path={model}", "eval.variant=bench", f"eval.n={args.n}",
                    f"eval.max_tokens={args.max_tokens}", f"profile.device={args.device}", f"model.dtype={args.dtype}",
                    f"eval.kv_cache_memory_bytes={args.kv_cache_bytes if args.device == 'cpu' else 0}"])


def _prompts(model: str, count: int) -> list[list[int]]:
    from common.models import load_tokenizer

    tokenizer = load_tokenizer(model)
    prompts = []
    for index in range(count):
        messages = [{"role": "system", "content": "Put the final answer in \\boxed{}."},
                    {"role": "user", "content": f"Compute {index + 3} * {2 * index + 7} - {index}."}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


def _measure(sampler, prompts: list[list[int]], n: int) -> tuple[int, float]:
    seeds = list(range(1, len(prompts) + 1))
    start = time.perf_counter()
    completions = sampler.sample(prompts, seeds, n)
    seconds = time.perf_counter() - start
    return sum(c.num_tokens for per_prompt in completions for c in per_prompt), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="HF folder or hub id (default: build a tiny random Qwen3)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kv-cache-bytes", type=int, default=1 << 30, help="vLLM KV cache on CPU")
    args = parser.parse_args()
    if args.device == "cpu":
        from common.tracking import bound_openmp_spin

        os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch and vllm are imported
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        bound_openmp_spin()

    import torch

    from bench.tiny_model import build_tiny_qwen3
    from eval.sample import HFSampler, VLLMSampler

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(build_tiny_qwen3(tmp, hidden_size=256, num_layers=4, dtype=args.dtype))
        cfg = _config(model, args)
        prompts = _prompts(model, args.prompts)
        max_model_len = max(len(p) for p in prompts) + args.max_tokens
        if args.device == "cpu":
            torch.set_num_threads(1)
        vllm_sampler = VLLMSampler(model, cfg, max_model_len)
        _measure(vllm_sampler, prompts[:1], 2)  # warm-up
        vllm_tokens, vllm_seconds = _measure(vllm_sampler, prompts, args.n)
        vllm_sampler.close()
        hf_sampler = HFSampler(model, cfg)
        _measure(hf_sampler, prompts[:1], 2)
        hf_tokens, hf_seconds = _measure(hf_sampler, prompts, args.n)
        hf_sampler.close()

    vllm_rate, hf_rate = vllm_tokens / vllm_seconds, hf_tokens / hf_seconds
    print(f"workload: {args.prompts} prompts x n={args.n} x max {args.max_tokens} tokens, {args.dtype}, "
          f"{args.device}, model {args.model or 'tiny random Qwen3 (h256, L4)'}")
    print(f"vLLM {vllm_sampler.version}: {vllm_tokens} tokens in {vllm_seconds:.1f} s = {vllm_rate:.0f} tok/s")
    print(f"HF generate {hf_sampler.version}: {hf_tokens} tokens in {hf_seconds:.1f} s = {hf_rate:.0f} tok/s")
    print(f"ratio vLLM/HF tokens per second: {vllm_rate / hf_rate:.2f}x")


if __name__ == "__main__":
    main()
