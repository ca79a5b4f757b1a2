"""Stage ``data``: training rows -> deterministic SFT / RL split -> sft.parquet, rl.parquet, rl_val.parquet, benchmarks.

    python -m data.prepare experiment=demo profile=toy
    python -m data.prepare experiment=table1 profile=paper data=openr1_local data.path=/data/openr1.parquet \
        data.benchmark_dir=/data/benchmarks

Needs no model (the SFT token ids are written afterwards by ``python -m data.tokenize_sft``). Outputs, in
``common.paths.data_run(cfg).directory``:

* ``sft.parquet``      LUFFY rows of the SFT split, plus ``row_id`` (the row's index in the source)
* ``rl.parquet``       verl RLHF rows (no ``target``) of the RL split; ``rl_val.parquet`` the held-out RL rows
* ``sft_heldout.parquet``  the held-out SFT slice (``data.num_heldout_rows`` > 0): LUFFY rows + ``row_id`` SFT never
  trains on, for the held-out NLL
* ``benchmarks/<name>.jsonl``  id, problem, answer, answer_raw and the chat ``prompt`` evaluation samples from
  (``data.benchmarks``; each extra benchmark that ``eval.benchmarks`` selects, ``data.extra_benchmarks``, is
  written afterwards by its own run, ``common.paths.extra_benchmark_run``)
* ``source/toy_rows.jsonl``    the generated toy rows (toy source only), loaded like any local file

With ``data.source=none`` the data run writes the benchmark files alone (no training set is read): what evaluating
a model needs (docs/data.md, "Benchmarks without a training set").

The manifest's ``details`` record the source (hub revision / file sha256), invalid rows, duplicate ids and problems,
split counts, a sha256 of each part's sorted ids and the SFT/RL problem overlap (0 by construction; checked anyway).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from data import benchmarks as bench
from data.formatting import verl_row
from data.loading import LoadedRows, load_rows
from data.schema import problem_key, problem_text, system_prompt
from data.split import ids_digest, split_rows
from data.tool_use import write_tool_split
from common.benchmarks import system_prompt_of, write_benchmark
from common.config import Config, stage_main
from common.preflight import PreflightError, check_data, check_data_paths
from common.config.data import TOOL_SOURCES
from common.manifest import Manifest, read_manifest, sha256_path, sha256_text, stage_run
from common.paths import (
    HELDOUT_ROWS_FILE,
    RL_TRAIN_FILE,
    RL_VAL_FILE,
    SFT_ROWS_FILE,
    RunSpec,
    benchmark_file,
    data_dir,
    data_run,
    extra_benchmark_run,
    selected_extra_benchmarks,
)
from common.seeding import derive_seed
from toy.worlds import benchmark_questions, training_rows

TOY_ROWS = "source/toy_rows.jsonl"


def write_toy_rows(cfg: Config, path: Path) -> None:
    toy = cfg.toy
    rows = training_rows(toy, derive_seed(toy.world_seed, "rows"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def write_parquet(path: Path, rows: list[dict]) -> None:
    from datasets import Dataset

    Dataset.from_list(rows).to_parquet(str(path))


def benchmark_system_prompt(cfg: Config, loaded: LoadedRows | None) -> tuple[str | None, dict]:
    """``data.system_prompt_path`` if set, else the most common system turn of the training rows (none without
    training rows)."""
    if cfg.data.system_prompt_path:
        text = Path(cfg.data.system_prompt_path).read_text(encoding="utf-8")
        return text, {"from": cfg.data.system_prompt_path, "sha256": sha256_text(text)}
    if loaded is None:
        return None, {"from": "none (data.source=none without data.system_prompt_path)"}
    counts = Counter(system_prompt(row) for row in loaded.rows)
    text, used_by = counts.most_common(1)[0]
    return text, {"from": "training rows", "sha256": sha256_text(text) if text else None,
                  "rows_with_it": used_by, "distinct_system_prompts": len(counts)}


def toy_benchmark_records(cfg: Config, name: str) -> list[dict]:
    toy = cfg.toy
    seed = derive_seed(toy.world_seed, f"benchmark-{name}")
    questions = benchmark_questions(toy, name, toy.num_benchmark_problems, seed)
    return [{"id": f"{name}-{i:03d}", "problem": question, "answer": str(answer), "answer_raw": str(answer)}
            for i, (question, answer) in enumerate(questions)]


def write_benchmarks(cfg: Config, out_dir: Path, system: str | None) -> dict:
    written = {}
    for name, source in cfg.data.benchmarks.items():
        if cfg.data.benchmark_source == "toy":
            records, provenance = toy_benchmark_records(cfg, name), {"kind": "toy"}
            bench.check_count(name, len(records), source.expected_count, f"toy benchmark {name}")
        else:
            records, provenance = bench.load_benchmark(name, source, cfg.data)
        write_benchmark(out_dir / benchmark_file(name), records, system)
        written[name] = dict(provenance, count=len(records))
    return written


def write_extra_benchmark(cfg: Config, name: str) -> Manifest:
    """The run of one selected extra benchmark (``data.extra_benchmarks``; :func:`common.paths.extra_benchmark_run`):
    its file, prompted with the system turn of the data run's own benchmarks, which must be complete."""
    spec = extra_benchmark_run(cfg, name)
    with stage_run(spec.directory, stage="data", variant=spec.variant, config=spec.config, inputs=spec.inputs,
                   seeds={}) as stage:
        if stage is None:
            return read_manifest(spec.directory)
        first = next(iter(cfg.data.benchmarks))
        system = system_prompt_of(data_dir(cfg) / benchmark_file(first))
        records, provenance = bench.load_benchmark(name, cfg.data.extra_benchmarks[name], cfg.data)
        write_benchmark(spec.directory / benchmark_file(name), records, system)
        stage.add_output(benchmark_file(name), f"benchmark {name}: id, problem, answer, prompt")
        stage.manifest.details.update({"benchmark": dict(provenance, count=len(records)),
                                       "system_prompt_from": str(data_dir(cfg) / benchmark_file(first))})
        stage.manifest.metrics["num_problems"] = len(records)
    return stage.manifest


def run(cfg: Config) -> Manifest:
    """The data run, then the run of every extra benchmark ``eval.benchmarks`` selects; returns the data run's
    manifest."""
    # Before anything is read: each local file and folder by its config key and, unless the data run is current, the
    # hub datasets cached or the hub answering within the preflight's probe timeout (offline: the hint, in seconds).
    spec = data_run(cfg)
    problems = check_data_paths(cfg) if spec.is_current() else check_data(cfg)
    if problems:
        raise PreflightError(problems)
    manifest = write_data_run(cfg, spec)
    if manifest.complete:
        for name in selected_extra_benchmarks(cfg):
            write_extra_benchmark(cfg, name)
    return manifest


def write_data_run(cfg: Config, spec: RunSpec) -> Manifest:
    """The data run ``spec`` (:func:`common.paths.data_run`): the split, the RL rows and the benchmarks of
    ``data.benchmarks``."""
    out_dir = spec.directory
    with stage_run(out_dir, stage="data", variant=spec.variant, config=spec.config, inputs=spec.inputs,
                   seeds={"split_seed": cfg.data.split_seed}) as stage:
        if stage is None:
            return read_manifest(out_dir)
        if cfg.data.source in TOOL_SOURCES:  # tool-use rows: SFT only, scored on BFCL (docs/tool_use.md)
            stage.manifest.details.update(write_tool_split(cfg.data, out_dir))
            stage.add_output(SFT_ROWS_FILE, "tool-use rows of the SFT split (data.tool_use.TOOL_PARQUET_COLUMNS)")
            stage.manifest.metrics["num_sft_rows"] = stage.manifest.details["split"]["counts"]["sft"]
            return stage.manifest
        if cfg.data.source == "none":  # benchmarks alone, prompted with data.system_prompt_path (or no system turn)
            system, system_record = benchmark_system_prompt(cfg, None)
            written = write_benchmarks(cfg, out_dir, system)
            for name in written:
                stage.add_output(benchmark_file(name), f"benchmark {name}: id, problem, answer, prompt")
            stage.manifest.details.update({"source": {"kind": "none"}, "benchmarks": written,
                                           "benchmark_system_prompt": system_record})
            return stage.manifest
        local_path = None
        if cfg.data.source == "toy":
            local_path = out_dir / TOY_ROWS
            write_toy_rows(cfg, local_path)
            stage.add_output(TOY_ROWS, "generated toy-world rows in the LUFFY schema")
        loaded = load_rows(cfg.data, local_path)
        if loaded.source["kind"] == "local":
            loaded.source["sha256"] = sha256_path(loaded.source["path"])
        problems = [problem_text(row) for row in loaded.rows]
        split = split_rows(problems, num_sft_rows=cfg.data.num_sft_rows, num_rl_rows=cfg.data.num_rl_rows,
                           num_rl_val_rows=cfg.data.num_rl_val_rows, split_seed=cfg.data.split_seed,
                           num_heldout_rows=cfg.data.num_heldout_rows)
        parts = {"sft": split.sft, "rl": split.rl, "rl_val": split.rl_val,
                 **({"heldout": split.heldout} if split.heldout else {})}
        keys = {part: {problem_key(problems[p]) for p in positions} for part, positions in parts.items()}
        overlap = {f"{a}_{b}": len(keys[a] & keys[b]) for i, a in enumerate(parts) for b in list(parts)[i + 1:]}
        if any(overlap.values()):
            raise RuntimeError(f"split parts share problems: {overlap}")

        write_parquet(out_dir / SFT_ROWS_FILE,
                      [dict(loaded.rows[p], row_id=loaded.row_ids[p]) for p in split.sft])
        write_parquet(out_dir / RL_TRAIN_FILE, [verl_row(loaded.rows[p], "train") for p in split.rl])
        if split.rl_val:
            write_parquet(out_dir / RL_VAL_FILE, [verl_row(loaded.rows[p], "val") for p in split.rl_val])
            stage.add_output(RL_VAL_FILE, "verl RLHF rows held out of the RL split for validation")
        stage.add_output(SFT_ROWS_FILE, "LUFFY rows of the SFT split (+ row_id)")
        if split.heldout:
            write_parquet(out_dir / HELDOUT_ROWS_FILE,
                          [dict(loaded.rows[p], row_id=loaded.row_ids[p]) for p in split.heldout])
            stage.add_output(HELDOUT_ROWS_FILE, "LUFFY rows of the held-out SFT slice (+ row_id), never trained on")
        stage.add_output(RL_TRAIN_FILE, "verl RLHF rows (data_source, prompt, ability, reward_model, extra_info)")

        system, system_record = benchmark_system_prompt(cfg, loaded)
        written = write_benchmarks(cfg, out_dir, system)
        for name in written:
            stage.add_output(benchmark_file(name), f"benchmark {name}: id, problem, answer, prompt")

        stage.manifest.details.update({
            "source": loaded.source,
            "num_source_rows": loaded.num_source_rows,
            "invalid_rows": {"policy": cfg.data.invalid_rows, "count": loaded.num_invalid,
                             "by_field": loaded.invalid_by_field, "first": loaded.invalid},
            "duplicates": loaded.duplicates,
            "split": {
                "seed": cfg.data.split_seed,
                "counts": {part: len(positions) for part, positions in parts.items()},
                "rl_rows_dropped_by_cap": split.num_rl_capped,
                "ids_sha256": {part: ids_digest([loaded.row_ids[p] for p in positions])
                               for part, positions in parts.items()},
                "problem_overlap": overlap,
            },
            "benchmarks": written,
            "benchmark_system_prompt": system_record,
        })
        stage.manifest.metrics.update({f"num_{part}_rows": len(positions) for part, positions in parts.items()})
    return stage.manifest


main = stage_main(run)


if __name__ == "__main__":
    main()
