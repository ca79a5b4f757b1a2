"""The evaluation stage's ``bfcl`` benchmark family (``data.benchmark_source=bfcl``; ``python -m eval.run`` hands the
run here): BFCL's questions sampled with the model's tool template, judged by BFCL's own checker
(:mod:`eval.bfcl.checker`).

For each category of ``eval.benchmarks`` (default: every one in ``data.benchmarks``) it asks the checker for BFCL's
entries (the first ``eval.max_problems``, or all), renders each with :func:`eval.bfcl.checker.prompt_ids` (the
model's chat template, or ``data.tool_template``), samples ``eval.n`` = 1 completion per question (BFCL's protocol;
seed ``derive_seed(seed, "eval/<category>/<id>")``), judges it, and writes into ``eval_dir(cfg, category)``:

* ``samples.jsonl``: one line per question (``problem_id``, ``sample_index`` 0, seed, text, tokens, finish reason,
  BFCL's ``valid`` and ``error_type``, ``correct`` = valid as 0/1), flushed question by question; a re-run keeps the
  finished questions and samples only the missing ones (the loop of :func:`eval.stage.sample_problems`).
* ``metrics.json``: accuracy, correct, total, its 95% bootstrap interval over questions (:mod:`eval.intervals`),
  the per-question verdicts (``correct_counts``), BFCL error types, and the protocol with ``bfcl_eval_version``
  and ``irrelevance_set``; the same two in the manifest's details.

The two appendix columns come from the categories' metrics (:func:`eval.bfcl.checker.summary`): BFCL live
(count-weighted over the live categories) and Irrelevance Detection (``live_irrelevance``); ``report.bfcl`` renders
them.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import numpy as np

from eval.bfcl.checker import (
    BFCL_EVAL_VERSION,
    DEFAULT_IRRELEVANCE,
    DEFAULT_REGISTRY_NAME,
    BfclChecker,
    CategoryScore,
    prompt_ids,
    summary,
)
from eval.intervals import estimate
from eval.sample import LazySampler, Sampler
from eval.stage import add_benchmark, backend_record, benchmark_names, log_to_wandb, resolve_model, sample_problems
from common.config import Config
from common.manifest import Manifest, read_manifest, stage_run, write_json_atomic
from common.models import load_tokenizer
from common.paths import (
    BASE_VARIANT,
    EVAL_METRICS_FILE,
    SAMPLES_FILE,
    configured_eval_run,
    eval_dir,
    sampling_protocol,
)


def accuracy_with_interval(verdicts: list[int]) -> dict[str, Any]:
    """Accuracy in percent of 0/1 verdicts and its 95% bootstrap interval over questions (:func:`estimate`)."""
    cell = estimate([np.asarray([verdicts], dtype=float)]).scaled(100)
    return {"accuracy": cell.mean, "interval": [cell.low, cell.high]}


def category_metrics(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One category's metrics from its per-question records (in question order)."""
    verdicts = [r["correct"] for r in records]
    return {"num_problems": len(records), "n": 1, "correct": sum(verdicts), "total": len(records),
            **accuracy_with_interval(verdicts),
            "correct_counts": {r["problem_id"]: r["correct"] for r in records},
            "error_types": dict(Counter(r["error_type"] for r in records if r["error_type"])),
            "truncated_rate": sum(r["finish_reason"] == "length" for r in records) / len(records),
            "mean_response_tokens": sum(r["num_tokens"] for r in records) / len(records)}


class _BfclEngine(LazySampler):
    """The tokenizer (with ``data.tool_template`` when set) and every category's entries and prompts now; the
    sampler on first use, with context ``eval.max_model_len`` or the longest prompt + ``max_tokens``."""

    def __init__(self, model_path: str, cfg: Config, factory: Callable[..., Sampler], checker: BfclChecker,
                 categories: list[str]):
        super().__init__(model_path, cfg, factory)
        self.tokenizer = load_tokenizer(model_path)
        if (template := cfg.data.tool_chat_template()) is not None:
            self.tokenizer.chat_template = template
        self.entries = {c: checker.entries(c)[:cfg.eval.max_problems or None] for c in categories}
        self.prompts = {c: [prompt_ids(self.tokenizer, entry) for entry in entries]
                        for c, entries in self.entries.items()}
        self.max_model_len = cfg.eval.max_model_len or cfg.eval.max_tokens + max(
            len(ids) for prompts in self.prompts.values() for ids in prompts)


def evaluate_category(cfg: Config, category: str, engine: _BfclEngine, checker: BfclChecker,
                      model_details: dict[str, Any]) -> Manifest:
    """Samples, judges and summarises one BFCL category under the run contract (skips, resumes or restarts)."""
    spec = configured_eval_run(cfg, category)
    out_dir = spec.directory
    entries, prompts = engine.entries[category], engine.prompts[category]
    protocol = {**sampling_protocol(cfg), "n": 1, "seed": cfg.seed, "bfcl_eval_version": checker.bfcl_eval_version,
                "irrelevance_set": DEFAULT_IRRELEVANCE, "decoder": DEFAULT_REGISTRY_NAME,
                "tool_template": cfg.data.tool_template or "the model's own"}
    with stage_run(out_dir, stage=spec.stage, variant=spec.variant, config=spec.config, inputs=spec.inputs,
                   seeds={"sampling": cfg.seed}) as run:
        if run is None:
            return read_manifest(out_dir)
        run.manifest.details.update({**model_details, "num_problems": len(entries), "variant": cfg.eval.variant,
                                     "phase": cfg.eval.phase, "bfcl_eval_version": checker.bfcl_eval_version,
                                     "irrelevance_set": DEFAULT_IRRELEVANCE})

        def judge(question: tuple[dict[str, Any], list[int]], completions: list, seed: int) -> list[dict[str, Any]]:
            entry, (completion,) = question[0], completions
            verdict = checker.check(category, entry["id"], completion.text)
            return [{"problem_id": entry["id"], "sample_index": 0, "seed": seed, "text": completion.text,
                     "num_tokens": completion.num_tokens, "finish_reason": completion.finish_reason,
                     "valid": verdict.valid, "error_type": verdict.error_type, "correct": int(verdict.valid)}]

        finished, sampling = sample_problems(
            cfg, category, out_dir / SAMPLES_FILE, list(zip(entries, prompts)), 1, engine, resumed=run.resumed,
            problem_id=lambda question: question[0]["id"], prompt_ids=lambda question: question[1], score=judge,
            unit="question")
        metrics = category_metrics([finished[entry["id"]][0] for entry in entries])
        backend = backend_record(engine, run.manifest)
        metrics_doc = {"benchmark": category, "phase": cfg.eval.phase, "variant": cfg.eval.variant,
                       "model": cfg.model.name, "model_path": engine.model_path, **metrics,
                       "protocol": {**protocol, "backend_version": backend.get("version", "")}}
        write_json_atomic(out_dir / EVAL_METRICS_FILE, metrics_doc)
        run.add_output(SAMPLES_FILE, "one line per question: problem_id, sample_index 0, seed, text, num_tokens, "
                                     "finish_reason, valid and error_type (BFCL's checker), correct (0/1)")
        run.add_output(EVAL_METRICS_FILE, "accuracy with its interval, per-question verdicts, BFCL error types, "
                                          "protocol")
        run.manifest.metrics = {k: v for k, v in metrics.items() if k not in ("correct_counts", "error_types")}
        run.manifest.details["backend"] = backend
        run.manifest.details["protocol"] = metrics_doc["protocol"]
        run.manifest.details["sampling"] = sampling
        run.manifest.details["seed_rule"] = "derive_seed(seed, 'eval/<category>/<question id>') per question"
        return run.manifest


def run_bfcl(cfg: Config, sampler_factory: Callable[..., Sampler], checker: BfclChecker | None = None) -> Manifest:
    """Evaluates one model on every selected BFCL category; returns a summary manifest (not written) whose metrics
    map each category to its headline numbers, plus ``bfcl``: :func:`eval.bfcl.checker.summary` of them."""
    categories = benchmark_names(cfg)
    model_path, model_details = resolve_model(cfg)
    if model_details["model"]["upstream_run"] is None and cfg.eval.variant == BASE_VARIANT and cfg.model.gguf_file:
        raise ValueError(f"model {cfg.model.name} is a GGUF file, which the samplers cannot load; evaluate its SFT "
                         "runs, or give an HF folder of it as eval.model_path")
    own_checker = checker is None
    checker = checker or BfclChecker()
    if checker.bfcl_eval_version != BFCL_EVAL_VERSION:
        print(f"[eval/bfcl] warning: the checker runs bfcl-eval {checker.bfcl_eval_version}, the project pins "
              f"{BFCL_EVAL_VERSION}")
    engine = _BfclEngine(model_path, cfg, sampler_factory, checker, categories)
    result = Manifest(stage=f"eval_{cfg.eval.phase}", variant=cfg.eval.variant, status="complete")
    try:
        for category in categories:
            add_benchmark(result, cfg, category, evaluate_category(cfg, category, engine, checker, model_details))
    finally:
        engine.close()
        if own_checker:
            checker.close()
    scores = {c: CategoryScore(result.metrics[c]["correct"], result.metrics[c]["total"]) for c in categories}
    result.metrics["bfcl"] = summary(scores, DEFAULT_IRRELEVANCE)
    log_to_wandb(cfg, result, model_details["model"], eval_dir(cfg, categories[0]).parent)
    return result
