"""Schema of the evaluation stage: which model, which benchmarks, the sampling protocol, the engine (the tables are
the report's: :mod:`common.config.report`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.config.common import SUPERVISION, ConfigError, SamplingConfig, check_choice, check_name, check_range


@dataclass
class EvalConfig(SamplingConfig):
    """Sampling with vLLM (or HF ``generate``; ``temperature`` and ``top_p`` from :class:`SamplingConfig`), scoring
    with math-verify, avg@n and unbiased pass@k."""

    phase: str = "sft"
    """sft (Table 1: the base model and the SFT checkpoints) or rl (Table 2: the DAPO checkpoints)."""
    variant: str = "base"
    """The evaluated model's name, which labels its run folder and table row: base (the untrained model, or RL from
    it) or an SFT method label (sft, eksft, eksft_rho0.1, ...)."""
    model_run: str = ""
    """The SFT (phase sft) or RL (phase rl) run folder to evaluate, which the orchestrator's plan hands down; empty:
    the configured method's run (``sft.method``; the base model for variant base), or RL's from it."""
    model_path: str = ""
    """Evaluate this HF folder or hub id instead of the variant's checkpoint (then name it with eval.variant)."""
    benchmarks: list[str] = field(default_factory=list)
    """Benchmarks to evaluate, names from data.benchmarks; empty = all of them."""
    n: int = 32
    """Samples per problem (avg@n; pass@k for every k ≤ n)."""
    n_per_benchmark: dict[str, int] = field(default_factory=dict)
    """Per-benchmark sample counts overriding n, e.g. {aime25: 320} for the paper's pass@k curve."""
    max_tokens: int = 8192
    """Response tokens per sample."""
    max_problems: int = 0
    """Evaluate only the first N problems of each benchmark (0 = all); for smoke runs."""
    backend: str = "vllm"
    """vllm (the offline engine) or hf (transformers generate, a slow fallback)."""
    problems_per_batch: int = 8
    """Problems per generate call (each problem's samples are written as soon as its batch returns)."""
    max_num_seqs: int = field(default=0, metadata=SUPERVISION)
    """Sequences vLLM decodes at once; 0 = vLLM's default, which it derives from the device's memory (256, or 1024
    on 70 GiB and more). On CPU the sampled tokens do not depend on it nor on problems_per_batch (each request carries
    its own seed; their reported log-probabilities differ in the last bits; tests/integration/test_eval_run.py); a tiny
    model is bound by per-step overhead, so the toy profile decodes 1024 at once (bench/stage_overhead.py)."""
    max_model_len: int = 0
    """Engine context length; 0 = longest prompt + max_tokens."""
    kv_cache_memory_bytes: int = 268435456
    """KV-cache size for vLLM (needed on CPU, where vLLM's default memory check fails); 0 = gpu_memory_utilization."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory vLLM may use (when kv_cache_memory_bytes is 0)."""
    tensor_parallel_size: int = 1
    """GPUs per vLLM engine."""
    data_parallel_size: int = field(default=1, metadata=SUPERVISION)
    """Engines sampling side by side, each in its own process on its own tensor_parallel_size GPUs; 0 = as many as
    the visible GPUs hold (one on CPU). Problems are dealt to engines batch by batch; results do not depend on it."""
    enforce_eager: bool = True
    """Skip torch.compile/CUDA graphs (required on CPU: its compile cache fails to load; slower on GPU)."""
    rejudge_timeout_s: float = field(default=30.0, metadata=SUPERVISION)
    """After sampling, every sample that the scorer's time limit scored 0 with no verdict is judged once more with
    this longer limit (0: never); those still without a verdict are counted under the report's tables."""

    def validate(self) -> None:
        check_choice("eval.phase", self.phase, ("sft", "rl"))
        check_name("eval.variant", self.variant)
        if self.model_path and self.model_run:
            raise ConfigError(f"eval.model_path ({self.model_path}) and eval.model_run ({self.model_run}) both name "
                              "the model to evaluate; set one")
        if self.model_path and self.variant == "base":
            raise ConfigError("eval.variant must name the model when eval.model_path is set "
                              "(e.g. eval.variant=my_model); 'base' is the experiment's own base model")
        check_range("eval.n", self.n, 1)
        for name, count in self.n_per_benchmark.items():
            check_range(f"eval.n_per_benchmark.{name}", count, 1)
        self.validate_sampling("eval", greedy=True)
        check_range("eval.max_tokens", self.max_tokens, 1)
        check_range("eval.max_problems", self.max_problems, 0)
        check_choice("eval.backend", self.backend, ("vllm", "hf"))
        check_range("eval.problems_per_batch", self.problems_per_batch, 1)
        check_range("eval.max_num_seqs", self.max_num_seqs, 0)
        check_range("eval.max_model_len", self.max_model_len, 0)
        check_range("eval.kv_cache_memory_bytes", self.kv_cache_memory_bytes, 0)
        check_range("eval.gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, low_open=True)
        check_range("eval.tensor_parallel_size", self.tensor_parallel_size, 1)
        check_range("eval.data_parallel_size", self.data_parallel_size, 0)
        check_range("eval.rejudge_timeout_s", self.rejudge_timeout_s, 0.0)

    def samples_for(self, benchmark: str) -> int:
        """Samples per problem on ``benchmark`` (``n_per_benchmark`` wins over ``n``)."""
        return self.n_per_benchmark.get(benchmark, self.n)
