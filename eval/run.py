"""The evaluation stage: ``python -m eval.run eval.phase=<sft|rl> eval.variant=<base|method label> [overrides]``.

For each benchmark (``eval.benchmarks``, default: every one in ``data.benchmarks``; an extra benchmark of
``data.extra_benchmarks`` only when named there) it reads the data stage's ``benchmarks/<name>.jsonl``
(``common.paths.benchmark_path``), renders each row's ``prompt`` messages with the evaluated model's chat template,
samples ``n`` completions per problem (seed per problem: ``derive_seed(seed, "eval/<benchmark>/<id>")``), scores
every sample with :func:`eval.scoring.verdict` (the judgement of ``verify``), and writes into
``eval_dir(cfg, benchmark)`` (from ``eval.phase``, ``eval.variant`` and ``eval.model_run``, the run folder the plan
hands down):

* ``samples.jsonl``: one line per sample, appended and flushed problem by problem. A crash or Ctrl-C loses no
  finished problem; a re-run keeps the finished problems and samples only the missing ones. A sample that the
  scorer's time limit scored 0 with no verdict (``time_limited``) is judged once more with the longer
  ``eval.rejudge_timeout_s`` once sampling is done (:func:`rejudge_time_limited`; ``rejudged`` in its record), so
  a re-run re-judges only what no run has re-judged yet.
* ``metrics.json``: avg@n, pass@k for k = 1, 2, 4, …, n, per-problem correct counts, truncation and no-answer
  rates, the number of samples re-judged (``rejudged_samples``) and of those still without a verdict
  (``time_limited_samples``), and the protocol (n, temperature, top_p, max_tokens, seed, backend and its version).
* ``manifest.json`` (``common.manifest.stage_run``): config, input hashes, engine settings, headline metrics.

In phase ``sft`` with a held-out SFT slice (``data.num_heldout_rows``), the same engine also scores that slice: the
held-out NLL (:mod:`eval.heldout`), in its own run folder ``heldout_nll/`` beside the benchmarks'.

The progress bar starts once the engine is up, so its rate and ETA measure sampling, and moves per problem as an
in-process engine (vLLM, HF) finishes it; an engine pool moves it per batch.

Sampling runs on ``eval.data_parallel_size`` engines side by side (``eval.sample.EnginePool``, one process per
``tensor_parallel_size`` GPUs), each call's problems dealt so that every engine gets a share (``engine_chunks``);
this process alone writes the files. With ``logging.wandb_mode`` online or offline, the headline metrics also go to
wandb (:func:`log_to_wandb`).

Any HF folder or hub id:
``python -m eval.run eval.model_path=/path/to/hf eval.variant=my_model eval.benchmarks=[aime24,amc] eval.n=4``.
"""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from eval.bfcl.evaluate import run_bfcl
from eval.heldout import evaluate_heldout, heldout_tokens_path, read_heldout_tokens
from eval.metrics import MEAN_TOKEN_ENTROPY, benchmark_metrics, mean_token_entropy
from eval.sample import (
    LazySampler,
    Sampler,
    configure_vllm_cpu_environment,
    make_sampler,
    render_prompt,
    response_prefix,
)
from eval.scoring import CORRECT, MAX_WORKERS, TIME_LIMITED, TIMEOUT_S, extract_answer, verdict
from eval.stage import (
    add_benchmark,
    backend_record,
    benchmark_names,
    log_to_wandb,
    resolve_model,
    result_lines,
    sample_problems,
    write_samples,
)
from common.benchmarks import read_benchmark
from common.config import Config, ConfigError, stage_main
from common.manifest import Manifest, read_manifest, stage_run, write_json_atomic
from common.models import load_tokenizer
from common.paths import (
    EVAL_METRICS_FILE,
    HELDOUT_NLL_DIR,
    SAMPLES_FILE,
    benchmark_path,
    configured_eval_run,
    eval_dir,
    evaluated_run,
    heldout_nll_run,
    sampling_protocol,
)
from common.preflight import require_stage


# ------------------------------------------------------------------------------------------------ inputs
def benchmark_rows(cfg: Config, benchmark: str) -> list[dict[str, Any]]:
    """The rows of ``benchmark`` this run evaluates (the first ``eval.max_problems``, or all)."""
    return read_benchmark(benchmark_path(cfg, benchmark))[:cfg.eval.max_problems or None]


# ----------------------------------------------------------------------------------------------- samples
def score_problem(row: dict[str, Any], completions: list, prefix: str, seed: int,
                  pool: ThreadPoolExecutor) -> list[dict[str, Any]]:
    """One samples.jsonl record per completion: text, tokens, finish reason, extracted answer, verdict (``correct``
    0/1, and ``time_limited`` when the scorer's time limit decided a 0)."""
    scored_texts = [prefix + c.text for c in completions]
    verdicts = list(pool.map(verdict, scored_texts, [row["answer"]] * len(completions)))
    return [{"problem_id": row["id"], "sample_index": index, "seed": seed, "text": c.text,
             "num_tokens": c.num_tokens, "neg_logprob_sum": c.neg_logprob_sum, "finish_reason": c.finish_reason,
             "answer": extract_answer(text), "correct": int(judged == CORRECT),
             "time_limited": judged == TIME_LIMITED}
            for index, (c, text, judged) in enumerate(zip(completions, scored_texts, verdicts))]


def rejudge_time_limited(finished: dict[str, list[dict[str, Any]]], answers: dict[str, tuple[str, str]],
                         timeout_s: float, pool: ThreadPoolExecutor, samples_path: Path) -> int:
    """Judges once more, with the longer limit ``timeout_s``, every record of ``finished`` (problem id → its
    records) that the scorer's time limit scored 0 (``time_limited``) and no run re-judged yet; ``answers``: problem
    id → (gold answer, response prefix). Each such record gets the new verdict (``correct``, ``time_limited``) and
    ``rejudged: true``; ``samples_path`` is rewritten (atomically) after each problem that changed, so an interrupted
    pass loses no verdict it wrote. Returns how many records it re-judged."""
    count = 0
    for problem_id, records in finished.items():
        todo = [record for record in records if record.get("time_limited") and not record.get("rejudged")]
        if not todo:
            continue
        gold, prefix = answers[problem_id]
        verdicts = list(pool.map(lambda text: verdict(prefix + text, gold, timeout_s=timeout_s),
                                 [record["text"] for record in todo]))
        for record, judged in zip(todo, verdicts):
            record.update(correct=int(judged == CORRECT), time_limited=judged == TIME_LIMITED, rejudged=True)
        write_samples(samples_path, finished)
        count += len(todo)
    return count


def check_rejudge_timeout(cfg: Config) -> None:
    """``eval.rejudge_timeout_s`` is 0 (off) or longer than the scorer's first limit."""
    if 0 < cfg.eval.rejudge_timeout_s <= TIMEOUT_S:
        raise ConfigError(f"eval.rejudge_timeout_s={cfg.eval.rejudge_timeout_s:g} is not longer than the scorer's "
                          f"first time limit ({TIMEOUT_S:g} s, eval.scoring.TIMEOUT_S); set it above that, or 0 to "
                          "never re-judge")


# ------------------------------------------------------------------------------------------------- stage
class _Engine(LazySampler):
    """The tokenizer now, the sampler on first use (so a fully finished run never starts an engine).

    Its context length is ``eval.max_model_len``, else the longest prompt of every benchmark of the run +
    ``max_tokens``, and at least ``longest_scored + 1`` (the longest sequence it scores, the held-out rows, plus the
    one token generated after it): fixed before the first batch, so every problem gets its full ``max_tokens`` and
    the length does not depend on how problems are batched or dealt to engines.
    """

    def __init__(self, model_path: str, cfg: Config, factory: Callable[..., Sampler], benchmarks: list[str],
                 longest_scored: int = 0):
        super().__init__(model_path, cfg, factory)
        self.tokenizer = load_tokenizer(model_path)
        if cfg.eval.max_model_len and longest_scored >= cfg.eval.max_model_len:
            raise ConfigError(f"eval.max_model_len={cfg.eval.max_model_len} is too short for the held-out SFT slice's "
                              f"longest row ({longest_scored} tokens, + 1 generated); raise it or set it to 0")
        self.max_model_len = cfg.eval.max_model_len or max(longest_scored + 1, cfg.eval.max_tokens + max(
            len(self.prompt_ids(prompt)) for name in benchmarks for prompt in self.prompts(benchmark_rows(cfg, name))))

    def prompts(self, rows: list[dict[str, Any]]) -> list[str]:
        return [render_prompt(self.tokenizer, row["prompt"]) for row in rows]

    def prompt_ids(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]


def evaluate_benchmark(cfg: Config, benchmark: str, engine: _Engine, model_details: dict[str, Any],
                       pool: ThreadPoolExecutor) -> Manifest:
    """Samples, scores and summarises one benchmark under the run contract (skips, resumes or restarts);
    ``model_details`` (:func:`eval.stage.resolve_model`) go into its manifest."""
    spec = configured_eval_run(cfg, benchmark)
    out_dir = spec.directory
    rows = benchmark_rows(cfg, benchmark)
    n = cfg.eval.samples_for(benchmark)
    prompts = engine.prompts(rows)
    prefixes = {response_prefix(p) for p in prompts}
    protocol = {**sampling_protocol(cfg), "n": n, "seed": cfg.seed, "think_prefix": sorted(prefixes) != [""]}

    with stage_run(out_dir, stage=spec.stage, variant=spec.variant, config=spec.config, inputs=spec.inputs,
                   seeds={"sampling": cfg.seed}) as run:
        if run is None:
            return read_manifest(out_dir)
        run.manifest.details.update({**model_details, "num_problems": len(rows), "variant": cfg.eval.variant,
                                     "phase": cfg.eval.phase})
        finished, sampling = sample_problems(
            cfg, benchmark, out_dir / SAMPLES_FILE, list(zip(rows, prompts)), n, engine, resumed=run.resumed,
            problem_id=lambda problem: problem[0]["id"], prompt_ids=lambda problem: engine.prompt_ids(problem[1]),
            score=lambda problem, completions, seed: score_problem(problem[0], completions,
                                                                   response_prefix(problem[1]), seed, pool))
        rejudged = 0
        if cfg.eval.rejudge_timeout_s:
            rejudged = rejudge_time_limited(finished, {row["id"]: (row["answer"], response_prefix(prompt))
                                                       for row, prompt in zip(rows, prompts)},
                                            cfg.eval.rejudge_timeout_s, pool, out_dir / SAMPLES_FILE)
        records_by_problem = [finished[row["id"]] for row in rows]
        metrics = summarize(records_by_problem, n)
        if metrics["time_limited_samples"] or rejudged:
            print(f"[eval/{benchmark}] {metrics['time_limited_samples']} samples scored 0 with no verdict within the "
                  f"scorer's time limit ({TIMEOUT_S:.0f} s, eval.scoring.TIMEOUT_S; math-verify's own timeout "
                  f"included), {rejudged} re-judged now with eval.rejudge_timeout_s={cfg.eval.rejudge_timeout_s:g}; "
                  "a loaded machine makes them more frequent (time_limited, rejudged in samples.jsonl)",
                  file=sys.stderr, flush=True)
        backend = backend_record(engine, run.manifest)
        metrics_doc = {"benchmark": benchmark, "phase": cfg.eval.phase, "variant": cfg.eval.variant,
                       "model": cfg.model.name, "model_path": engine.model_path, **metrics,
                       "rejudge_timeout_s": cfg.eval.rejudge_timeout_s, "protocol": {
                           **protocol, "backend_version": backend.get("version", "")}}
        write_json_atomic(out_dir / EVAL_METRICS_FILE, metrics_doc)
        run.add_output(SAMPLES_FILE, "one line per sample: problem_id, sample_index, seed, text, num_tokens, "
                                     "neg_logprob_sum, finish_reason, answer (extracted), correct (0/1), time_limited, "
                                     "rejudged (where judged again with the longer limit)")
        run.add_output(EVAL_METRICS_FILE, "avg@n, pass@k, per-problem correct counts, protocol")
        run.manifest.metrics = {key: value for key, value in metrics.items() if key != "correct_counts"}
        run.manifest.details["backend"] = backend
        run.manifest.details["protocol"] = metrics_doc["protocol"]
        run.manifest.details["sampling"] = sampling
        run.manifest.details["seed_rule"] = "derive_seed(seed, 'eval/<benchmark>/<problem id>') per problem"
        run.manifest.details["rejudge"] = {"timeout_s": cfg.eval.rejudge_timeout_s, "rejudged_now": rejudged,
                                           "rejudged": metrics["rejudged_samples"],
                                           "still_time_limited": metrics["time_limited_samples"]}
        return run.manifest


def summarize(records_by_problem: list[list[dict[str, Any]]], n: int) -> dict[str, Any]:
    """avg@n, pass@k (k = 1, 2, 4, …, n), correct counts per problem, truncation and no-answer rates, the samples
    re-judged and those still without a verdict, mean response tokens and the mean sampled-token entropy (None for
    samples without ``neg_logprob_sum``)."""
    counts = [sum(r["correct"] for r in records) for records in records_by_problem]
    samples = [r for records in records_by_problem for r in records]
    return {"num_problems": len(counts), "n": n, **benchmark_metrics(counts, n),
            "correct_counts": {records[0]["problem_id"]: c for records, c in zip(records_by_problem, counts)},
            "truncated_rate": sum(r["finish_reason"] == "length" for r in samples) / len(samples),
            "no_answer_rate": sum(r["answer"] is None for r in samples) / len(samples),
            "time_limited_samples": sum(r.get("time_limited", False) for r in samples),
            "rejudged_samples": sum(r.get("rejudged", False) for r in samples),
            "mean_response_tokens": sum(r["num_tokens"] for r in samples) / len(samples),
            MEAN_TOKEN_ENTROPY: mean_token_entropy([r.get("neg_logprob_sum") for r in samples],
                                                   [r["num_tokens"] for r in samples])}


def run(cfg: Config, sampler_factory: Callable[..., Sampler] = make_sampler) -> Manifest:
    """Evaluates one model (``eval.phase`` / ``eval.variant`` or ``eval.model_path``) on every selected benchmark.

    Returns a summary manifest (not written: the per-benchmark manifests are the record) whose metrics map each
    benchmark to its headline numbers and whose status is complete when every benchmark is.
    """
    require_stage(cfg, f"eval_{cfg.eval.phase}")  # common/preflight.py: GPUs, a CUDA vLLM, the model path
    check_rejudge_timeout(cfg)
    if cfg.eval.backend == "vllm" and cfg.profile.device == "cpu":
        configure_vllm_cpu_environment()  # before the tokenizer below imports torch
    if cfg.data.benchmark_source == "bfcl":  # the tool-use family, scored by BFCL's checker (docs/tool_use.md)
        summary = run_bfcl(cfg, sampler_factory)
    else:
        summary = evaluate_answer_benchmarks(cfg, sampler_factory)
    print("\n".join(f"results: {line}" for line in result_lines(cfg, summary)), flush=True)
    return summary


def evaluate_answer_benchmarks(cfg: Config, sampler_factory: Callable[..., Sampler]) -> Manifest:
    """Every selected benchmark scored by its answers (math, toy; and the held-out NLL in phase sft); the summary."""
    benchmarks = benchmark_names(cfg)
    model_path, model_details = resolve_model(cfg)
    scores_heldout = cfg.eval.phase == "sft" and \
        heldout_nll_run(cfg, cfg.eval.variant, evaluated_run(cfg)) is not None
    heldout = read_heldout_tokens(heldout_tokens_path(cfg)) if scores_heldout else None
    engine = _Engine(model_path, cfg, sampler_factory, benchmarks,
                     max(map(len, heldout[0])) if heldout is not None else 0)
    summary = Manifest(stage=f"eval_{cfg.eval.phase}", variant=cfg.eval.variant, status="complete")
    try:
        with ThreadPoolExecutor(MAX_WORKERS) as pool:
            for benchmark in benchmarks:
                add_benchmark(summary, cfg, benchmark, evaluate_benchmark(cfg, benchmark, engine, model_details, pool))
            if heldout is not None:
                manifest = evaluate_heldout(cfg, engine.sampler, *heldout, model_details["model"])
                summary.metrics[HELDOUT_NLL_DIR] = manifest.metrics
                if not manifest.complete:
                    summary.status = manifest.status
    finally:
        engine.close()
    log_to_wandb(cfg, summary, model_details["model"], eval_dir(cfg, benchmarks[0]).parent)
    return summary


main = stage_main(run)


if __name__ == "__main__":
    main()
