"""Tiny fixtures for the SFT trainer tests: a random 2-layer Qwen3 with a ChatML BPE tokenizer, and a
tokenised SFT split in the data stage's format (with a complete data manifest), all in a tmp folder; a
single-rank gloo process group (``one_rank``); and EKSFT's KL at step 0 of a bench trainer (``step_zero_kl``)."""
from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from bench.sft_step_time import SIZES, build_trainer, random_micro_batches, release
from bench.tiny_model import TRAINING_TEXTS, build_tiny_qwen3
from common.config import Config, compose
from common.config.sft import EKSFTMethod
from common.manifest import stage_run
from common.paths import BEHAVIOUR_LOGP_COLUMN, SFT_TOKENS_FILE, hf_export_dir, sft_dir, tokens_dir
from common.processes import start_in_new_session, stop_tree
from common.tracking import CPU_OPENMP_ENV
from sft.checkpoint import TRAINER_STATE_FILE
from sft.data import IGNORE_INDEX
from sft.distributed import close_distributed, init_distributed

REPO_ROOT = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 10.0
WORDS = sorted(set(" ".join(TRAINING_TEXTS).split()))
"""Words the tiny model's BPE tokenizer was trained on, so each is one or a few tokens."""


HEADS = ["tied", "untied"]
"""The LM head of the tiny model: tied to the embeddings (Qwen3-4B and smaller) or a weight of its own (Qwen3-8B)."""


def build_tiny_model(folder: Path, seed: int = 0, head: str = "tied") -> Path:
    """The tiny fp32 Qwen3 (hidden 128, 2 layers, 2 heads x 64) of :mod:`bench.tiny_model` in ``folder``, with a
    ``head`` of :data:`HEADS`.

    Its eos and generation config's eos are ``<|endoftext|>``, not the template's ``<|im_end|>``: the export must
    fix them.
    """
    return build_tiny_qwen3(folder, intermediate_size=256, max_position_embeddings=512, eos_token="<|endoftext|>",
                            dtype="float32", seed=seed, tie_word_embeddings=head == "tied")


@pytest.fixture
def one_rank():
    """A single-rank gloo process group (``sft.distributed.init_distributed``), closed after the test; a test
    module takes it by importing it."""
    env = init_distributed("cpu")
    yield env
    close_distributed(env)


def write_sft_tokens(cfg: Config, num_rows: int, seed: int = 0) -> Path:
    """A tokenised SFT split (chat-formatted random words, labels on the response and its ``<|im_end|>``)
    plus a complete data-stage manifest, where ``sft.train`` looks for it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    rng = random.Random(seed)
    columns = {"row_id": [], "input_ids": [], "labels": [], "num_response_tokens": [], "truncated": []}
    for index in range(num_rows):
        question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8)))
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20)))
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                               add_generation_prompt=True)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = tokenizer(answer + "<|im_end|>\n", add_special_tokens=False)["input_ids"]
        columns["row_id"].append(f"row-{index}")
        columns["input_ids"].append(prompt_ids + response_ids)
        columns["labels"].append([IGNORE_INDEX] * len(prompt_ids) + response_ids)
        columns["num_response_tokens"].append(len(response_ids))
        columns["truncated"].append(False)
        if cfg.sft.method.reads_behaviour_logprobs():  # PEAR: a behaviour policy that gave each response token e^-0.1
            columns.setdefault(BEHAVIOUR_LOGP_COLUMN, []).append([math.nan] * len(prompt_ids)
                                                                 + [-0.1] * len(response_ids))
    folder = tokens_dir(cfg)
    with stage_run(folder, stage="data", variant=cfg.model.name, config={"rows": num_rows, "seed": seed},
                   announce=lambda message: None) as run:
        pq.write_table(pa.table(columns), folder / SFT_TOKENS_FILE)
        run.add_output(SFT_TOKENS_FILE, "tokenised SFT split")
    return folder / SFT_TOKENS_FILE


def tiny_overrides(run_root: Path, model_dir: Path, method: str = "sft", **sft: object) -> list[str]:
    """Hydra overrides for a fast fp32 run of the tiny model on the toy profile (``sft`` entries override more)."""
    values = {"micro_batch_size": 2, "grad_accum": 2, "epochs": 1, "max_steps": -1, "lr": 1e-3,
              "warmup_ratio": 0.25, "mixed_precision": "fp32", "checkpoint_every": 0, "keep_checkpoints": 10,
              "chunk_size": 16, **sft}
    return ["profile=toy", f"sft/method={method}", f"experiment.run_root={run_root}", "experiment.name=t",
            "model.source=hub", f"model.path={model_dir}", "model.name=tiny", "logging.progress=false",
            *[f"sft.{key}={value}" for key, value in values.items()]]


def prepare_run(run_root: Path, model_dir: Path, num_rows: int, method: str = "sft", **sft: object):
    overrides = tiny_overrides(run_root, model_dir, method, **sft)
    cfg = compose(overrides)
    write_sft_tokens(cfg, num_rows)
    return cfg, overrides


def final_weights(cfg: Config) -> dict[str, torch.Tensor]:
    return load_file(hf_export_dir(sft_dir(cfg)) / "model.safetensors")


def sft_command(overrides: list[str], nproc: int) -> list[str]:
    return [str(Path(sys.executable).with_name("torchrun")), "--standalone", f"--nproc_per_node={nproc}",
            "-m", "sft.train", *overrides]


def child_env() -> dict[str, str]:
    return {**os.environ, **CPU_OPENMP_ENV, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_in_session(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs ``argv`` from the checkout in its own session (``common.processes``) with ``env`` (default
    :func:`child_env`), stdout and stderr merged into ``stdout``; on a timeout (or an interrupt) its whole process tree
    is stopped before the error propagates."""
    process = start_in_new_session(argv, child_env() if env is None else env, cwd=REPO_ROOT)
    try:
        output, _ = process.communicate(timeout=timeout)
    except BaseException:
        stop_tree(process, STOP_GRACE_S)
        raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout=output, stderr="")


def run_torchrun(overrides: list[str], nproc: int, timeout: int = 240) -> subprocess.CompletedProcess:
    """``torchrun --standalone`` (a fresh port per launch) with one retry, as toy_world.md §2 advises."""
    for attempt in range(2):
        result = run_in_session(sft_command(overrides, nproc), timeout)
        if result.returncode == 0 or attempt == 1:
            return result
    return result


def kill_after_checkpoint(overrides: list[str], checkpoint_dir: Path, timeout: float = 240, nproc: int = 1) -> int:
    """Starts training (1 process, or torchrun with ``nproc`` ranks) and SIGKILLs its process tree once
    ``checkpoint_dir`` is complete."""
    argv = sft_command(overrides, nproc) if nproc > 1 else [sys.executable, "-m", "sft.train", *overrides]
    process = start_in_new_session(argv, child_env(), cwd=REPO_ROOT)
    output: list[str] = []
    threading.Thread(target=lambda: output.extend(process.stdout), daemon=True).start()  # the pipe never fills
    deadline = time.monotonic() + timeout
    try:
        while not (checkpoint_dir / TRAINER_STATE_FILE).exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"training exited ({process.returncode}) or timed out before {checkpoint_dir}:\n"
                                     + "".join(output)[-3000:])
            time.sleep(0.02)
        return stop_tree(process, STOP_GRACE_S, first_signal=signal.SIGKILL)
    finally:
        if process.poll() is None:
            stop_tree(process, STOP_GRACE_S, first_signal=signal.SIGKILL)


def step_zero_kl(args, env) -> tuple[float, float]:
    """EKSFT's KL at step 0 (``kl_mean_rest``) and the size of its KL mask (``num_M_KL``) on the first micro-batch of
    ``bench.sft_step_time``'s trainer for ``args`` (policy and reference the same random base): (0, 0) exactly when
    the reference computes what the policy does. The trainer is released before it returns."""
    root, _, _ = build_trainer(EKSFTMethod(), args, env)
    with torch.no_grad():
        metrics = root(**random_micro_batches(args, SIZES[args.size][-1], env.device)[0]).metrics
    del root
    release(env)
    return float(metrics["kl_mean_rest"]), float(metrics["num_M_KL"])
