"""Stage ``data`` (second half): tokenise the SFT split with the base model's tokenizer.

    python -m data.tokenize_sft experiment=demo profile=toy        # after data.prepare and data.toy_base

Reads ``sft.parquet`` (from a complete data manifest) and the tokenizer at ``pipeline.paths.base_model_path(cfg)``,
and writes ``<data_dir>/<model.name>/sft_tokens.parquet`` with columns ``input_ids``, ``labels`` (-100 on the
prompt), ``num_response_tokens``, ``truncated`` and ``row_id``, plus its own manifest: the SFT trainer reads only
token ids. Formatting rules: :mod:`data.formatting`.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path


from data.formatting import PromptTooLongError, build_sft_example
from pipeline.config import Config, stage_main
from pipeline.manifest import Manifest, read_manifest, require_complete, stage_run
from pipeline.models import load_tokenizer
from pipeline.paths import base_model_path, data_dir, toy_base_dir
from pipeline.tracking import progress

TOKENS_FILE = "sft_tokens.parquet"


def tokenizer_input(cfg: Config) -> dict[str, Path]:
    """The tokenizer files this stage depends on, when they are local (a hub id is recorded in the config)."""
    path = Path(base_model_path(cfg))
    if cfg.model.gguf_file:
        return {"tokenizer": path / cfg.model.gguf_file}
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (path / name).is_file():
            return {"tokenizer": path / name}
    return {}


def write_tokens(path: Path, columns: dict[str, list]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "input_ids": pa.array(columns["input_ids"], type=pa.list_(pa.int32())),
        "labels": pa.array(columns["labels"], type=pa.list_(pa.int32())),
        "num_response_tokens": pa.array(columns["num_response_tokens"], type=pa.int32()),
        "truncated": pa.array(columns["truncated"], type=pa.bool_()),
        "row_id": pa.array(columns["row_id"], type=pa.int64()),
    })
    pq.write_table(table, path)


def run(cfg: Config) -> Manifest:
    import pyarrow.parquet as pq

    source_dir = data_dir(cfg)
    require_complete(source_dir, "data stage (python -m data.prepare)")
    if cfg.model.source == "toy":
        require_complete(toy_base_dir(cfg), "toy base model (python -m data.toy_base)")
    out_dir = source_dir / cfg.model.name
    config = {"model": asdict(cfg.model), "max_length": cfg.data.max_length,
              "strip_leading_think": cfg.data.strip_leading_think, "tokenizer_path": base_model_path(cfg)}
    inputs = {"sft_rows": source_dir / "sft.parquet", **tokenizer_input(cfg)}
    with stage_run(out_dir, stage="data_tokens", variant=cfg.model.name, config=config, inputs=inputs) as stage:
        if stage is None:
            return read_manifest(out_dir)
        tokenizer = load_tokenizer(base_model_path(cfg), gguf_file=cfg.model.gguf_file)
        rows = pq.read_table(source_dir / "sft.parquet").to_pylist()
        columns: dict[str, list] = {k: [] for k in ("input_ids", "labels", "num_response_tokens", "truncated",
                                                    "row_id")}
        prompt_too_long: list[int] = []
        for row in progress(rows, desc="tokenising SFT rows", enabled=cfg.logging.progress, unit="row"):
            try:
                example = build_sft_example(tokenizer, row["prompt"], row["target"][0]["content"],
                                            cfg.data.max_length, cfg.data.strip_leading_think)
            except PromptTooLongError:
                prompt_too_long.append(row["row_id"])
                continue
            for key in ("input_ids", "labels", "num_response_tokens", "truncated"):
                columns[key].append(getattr(example, key))
            columns["row_id"].append(row["row_id"])
        if not columns["row_id"]:
            raise ValueError(f"every SFT row's prompt reaches data.max_length={cfg.data.max_length}")
        write_tokens(out_dir / TOKENS_FILE, columns)
        stage.add_output(TOKENS_FILE, "SFT token ids and labels (-100 on the prompt), one row per example")
        lengths = [len(ids) for ids in columns["input_ids"]]
        stage.manifest.details.update({
            "tokenizer": {"path": base_model_path(cfg), "eos_token": tokenizer.eos_token,
                          "eos_token_id": tokenizer.eos_token_id, "vocab_size": len(tokenizer)},
            "num_rows_in": len(rows),
            "num_examples": len(lengths),
            "num_truncated": sum(columns["truncated"]),
            "num_dropped_prompt_too_long": len(prompt_too_long),
            "dropped_prompt_too_long_row_ids": prompt_too_long[:100],
            "max_length": cfg.data.max_length,
        })
        stage.manifest.metrics.update({
            "num_examples": len(lengths), "num_truncated": sum(columns["truncated"]),
            "num_response_tokens": sum(columns["num_response_tokens"]),
            "mean_length": sum(lengths) / len(lengths), "max_length_seen": max(lengths),
        })
    return stage.manifest


main = stage_main(run)


if __name__ == "__main__":
    main()
