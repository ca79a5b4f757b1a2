"""Held-out NLL, a pre-RL diagnostic: how well a model predicts SFT-style solutions it was never trained on.

The data stage sets aside ``data.num_heldout_rows`` rows of the split order that SFT never trains on (the held-out
SFT slice, ``data.split``); the tokens stage tokenises them exactly as the SFT rows (``labels`` = -100 on the
prompt). The evaluation stage (phase ``sft``: the base model and every SFT export) scores them with the engine it
already has loaded: vLLM's ``prompt_logprobs`` (raw log-probabilities, no temperature or top-p; the HF backend: one
teacher-forced forward). The NLL is

    NLL = −Σ_rows Σ_{t: labels[t] ≠ −100} log p(x_t | x_<t)  /  #{(row, t): labels[t] ≠ −100}

in nats per supervised response token: the SFT cross-entropy with the prompt masked as SFT masks it, pooled over the
slice's tokens. It is the metric :data:`common.paths.HELDOUT_NLL` of the run :func:`common.paths.heldout_nll_run`
(``<eval variant folder>/heldout_nll/manifest.json``, beside the benchmarks' folders), read by the report.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from common.config import Config
from common.manifest import Manifest, read_manifest, require_complete, stage_run
from common.paths import HELDOUT_NLL, HELDOUT_TOKENS_FILE, IGNORE_INDEX, evaluated_run, heldout_nll_run, tokens_dir


def heldout_nll(logprobs_by_row: Sequence[Sequence[float | None]],
                labels_by_row: Sequence[Sequence[int]]) -> tuple[float, int]:
    """``(NLL, tokens)`` of the module formula: ``logprobs[t] = log p(x_t | x_<t)`` (entry 0 is never used: the
    first token has no prefix and is a prompt token), ``labels[t] = -100`` where SFT does not train."""
    total, count = 0.0, 0
    for row, (logprobs, labels) in enumerate(zip(logprobs_by_row, labels_by_row, strict=True)):
        if len(logprobs) != len(labels):
            raise ValueError(f"held-out row {row}: {len(logprobs)} log-probabilities for {len(labels)} labels")
        if labels and labels[0] != IGNORE_INDEX:
            raise ValueError(f"held-out row {row}: its first token is supervised (it has no prefix to predict it)")
        for logprob, label in zip(logprobs[1:], labels[1:]):
            if label != IGNORE_INDEX:
                total -= logprob
                count += 1
    if count == 0:
        raise ValueError("the held-out slice has no supervised token")
    return total / count, count


def read_heldout_tokens(path: Path) -> tuple[list[list[int]], list[list[int]]]:
    """``(input_ids, labels)`` of every row of a tokens run's ``heldout_tokens.parquet``."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["input_ids", "labels"]).to_pydict()
    return table["input_ids"], table["labels"]


def heldout_tokens_path(cfg: Config) -> Path:
    """The held-out slice's tokens, from a complete tokens run."""
    require_complete(tokens_dir(cfg), "tokenised held-out SFT slice")
    return tokens_dir(cfg) / HELDOUT_TOKENS_FILE


def evaluate_heldout(cfg: Config, sampler: Any, input_ids: list[list[int]], labels: list[list[int]],
                     model_record: dict[str, Any]) -> Manifest:
    """The held-out NLL of the evaluated model under the run contract (skipped when current); ``sampler`` is a
    zero-argument callable returning the loaded engine (started only when the NLL has to be computed)."""
    spec = heldout_nll_run(cfg, cfg.eval.variant, evaluated_run(cfg))
    with stage_run(spec.directory, stage=spec.stage, variant=spec.variant, config=spec.config,
                   inputs=spec.inputs) as run:
        if run is None:
            return read_manifest(spec.directory)
        nll, tokens = heldout_nll(sampler().prompt_logprobs(input_ids), labels)
        if not math.isfinite(nll):
            raise ValueError(f"held-out NLL of {model_record['path']} is {nll}")
        metrics = {HELDOUT_NLL: nll, "num_rows": len(input_ids), "num_tokens": tokens}
        run.manifest.metrics = metrics
        run.manifest.details.update({"model": model_record, "variant": cfg.eval.variant, "phase": cfg.eval.phase,
                                     "backend": cfg.eval.backend})
        print(f"[eval/heldout] {cfg.eval.variant}: NLL {nll:.4f} nats/token over {tokens} tokens of "
              f"{len(input_ids)} rows")
        return run.manifest

