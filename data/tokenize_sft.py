"""Stage ``data`` (second half): tokenise the SFT split with the base model's tokenizer.

    python -m data.tokenize_sft experiment=demo profile=toy        # after data.prepare and toy.base

Reads ``sft.parquet`` (from a complete data manifest) and the tokenizer at ``common.paths.base_model_path(cfg)``,
and writes ``sft_tokens.parquet`` into ``common.paths.tokens_run(cfg).directory`` with columns ``input_ids``, ``labels`` (-100 on the
prompt), ``num_response_tokens``, ``truncated``, ``row_id`` and, when the rows have ``behaviour_logprobs``,
``behaviour_logp`` (:func:`behaviour_token_logprobs`), plus its own manifest: the SFT trainer reads only
token ids. When the data run has a held-out SFT slice (``data.num_heldout_rows``) it is tokenised the same way into
``heldout_tokens.parquet`` (read by evaluation for the held-out NLL). Formatting rules: :mod:`data.formatting`.
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path

from data.formatting import PromptTooLongError, SFTExample, build_sft_example, render_prompt, strip_think
from data.tool_use import build_tool_sft_example
from common.config import Config, stage_main
from common.config.data import TOOL_SOURCES
from common.manifest import Manifest, read_manifest, stage_run
from common.models import end_of_turn_token, load_tokenizer
from common.paths import (
    BEHAVIOUR_LOGP_COLUMN,
    BEHAVIOUR_LOGPROBS_COLUMN,
    HELDOUT_ROWS_FILE,
    HELDOUT_TOKENS_FILE,
    SFT_ROWS_FILE,
    SFT_TOKENS_FILE,
    base_model_path,
    data_dir,
    tokens_run,
)
from common.tracking import progress


def write_tokens(path: Path, columns: dict[str, list]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "input_ids": pa.array(columns["input_ids"], type=pa.list_(pa.int32())),
        "labels": pa.array(columns["labels"], type=pa.list_(pa.int32())),
        "num_response_tokens": pa.array(columns["num_response_tokens"], type=pa.int32()),
        "truncated": pa.array(columns["truncated"], type=pa.bool_()),
        "row_id": pa.array(columns["row_id"], type=pa.int64()),
        **({BEHAVIOUR_LOGP_COLUMN: pa.array(columns[BEHAVIOUR_LOGP_COLUMN], type=pa.list_(pa.float32()))}
           if columns.get(BEHAVIOUR_LOGP_COLUMN) else {}),
    })
    pq.write_table(table, path)


def behaviour_token_logprobs(tokenizer, row: dict, example: SFTExample, strip_leading_think: str) -> list[float]:
    """Per token of ``example``, the behaviour log-probability from the row's ``behaviour_logprobs`` segments: NaN on
    the prompt, and on each response token the sum of the segments that start in it (a segment cut by the stripped
    ``<think>`` prefix counts on the first token; the end-of-turn token, which the chat format adds, 0)."""
    target = row["target"][0]["content"]
    stripped = strip_think(render_prompt(tokenizer, row["prompt"]), target, strip_leading_think)
    encoded = tokenizer(stripped + end_of_turn_token(tokenizer), add_special_tokens=False,
                        return_offsets_mapping=True)
    num_prompt = len(example.input_ids) - example.num_response_tokens
    if encoded["input_ids"][:example.num_response_tokens] != example.input_ids[num_prompt:]:
        raise ValueError(f"row {row['row_id']}: the response's tokens with offsets differ from the example's")
    starts = [max(end - len(target) + len(stripped), 0) for end in
              itertools.accumulate(len(segment["text"]) for segment in [{"text": ""}, *row[BEHAVIOUR_LOGPROBS_COLUMN]])]
    per_token = [0.0] * example.num_response_tokens
    for start, segment in zip(starts, row[BEHAVIOUR_LOGPROBS_COLUMN]):
        token = next((i for i, (a, b) in enumerate(encoded["offset_mapping"][:example.num_response_tokens])
                      if a <= start < b), None)
        if token is not None:  # None: the segment is empty or after the truncation
            per_token[token] += segment["logprob"]
    return [math.nan] * num_prompt + per_token


def tokenise_rows(cfg: Config, tokenizer, rows: list[dict], what: str) -> tuple[dict[str, list], list[int]]:
    """The token columns of ``rows`` (LUFFY + ``row_id``, or tool-use rows: :func:`build_tool_sft_example`) and the
    ``row_id`` of each row whose prompt alone reaches ``data.max_length`` (dropped)."""
    columns: dict[str, list] = {k: [] for k in ("input_ids", "labels", "num_response_tokens", "truncated", "row_id",
                                                 BEHAVIOUR_LOGP_COLUMN)}
    prompt_too_long: list[int] = []
    tool_rows = cfg.data.source in TOOL_SOURCES
    for row in progress(rows, desc=f"tokenising {what} rows", enabled=cfg.logging.progress, unit="row"):
        try:
            example = build_tool_sft_example(tokenizer, row, cfg.data.max_length) if tool_rows else \
                build_sft_example(tokenizer, row["prompt"], row["target"][0]["content"], cfg.data.max_length,
                                  cfg.data.strip_leading_think)
        except PromptTooLongError:
            prompt_too_long.append(row["row_id"])
            continue
        for key in ("input_ids", "labels", "num_response_tokens", "truncated"):
            columns[key].append(getattr(example, key))
        columns["row_id"].append(row["row_id"])
        if not tool_rows and row.get(BEHAVIOUR_LOGPROBS_COLUMN) is not None:
            columns[BEHAVIOUR_LOGP_COLUMN].append(behaviour_token_logprobs(tokenizer, row, example,
                                                                           cfg.data.strip_leading_think))
    if 0 < len(columns[BEHAVIOUR_LOGP_COLUMN]) < len(columns["row_id"]):
        raise ValueError(f"{len(columns['row_id']) - len(columns[BEHAVIOUR_LOGP_COLUMN])} of the {what} rows have no "
                         f"{BEHAVIOUR_LOGPROBS_COLUMN}: give it on every row or on none")
    return columns, prompt_too_long


def run(cfg: Config) -> Manifest:
    import pyarrow.parquet as pq

    spec = tokens_run(cfg)
    out_dir, source_dir = spec.directory, data_dir(cfg)
    with stage_run(out_dir, stage="tokens", variant=spec.variant, config=spec.config, inputs=spec.inputs) as stage:
        if stage is None:
            return read_manifest(out_dir)
        tokenizer = load_tokenizer(base_model_path(cfg), gguf_file=cfg.model.gguf_file)
        if (template := cfg.data.tool_chat_template()) is not None:
            tokenizer.chat_template = template
        rows = pq.read_table(source_dir / SFT_ROWS_FILE).to_pylist()
        columns, prompt_too_long = tokenise_rows(cfg, tokenizer, rows, "SFT")
        if not columns["row_id"]:
            raise ValueError(f"every SFT row's prompt reaches data.max_length={cfg.data.max_length}")
        write_tokens(out_dir / SFT_TOKENS_FILE, columns)
        stage.add_output(SFT_TOKENS_FILE, "SFT token ids and labels (-100 on the prompt), one row per example")
        if cfg.data.num_heldout_rows:
            heldout, heldout_too_long = tokenise_rows(
                cfg, tokenizer, pq.read_table(source_dir / HELDOUT_ROWS_FILE).to_pylist(), "held-out")
            write_tokens(out_dir / HELDOUT_TOKENS_FILE, heldout)
            stage.add_output(HELDOUT_TOKENS_FILE, "the held-out SFT slice tokenised as the SFT rows")
            stage.manifest.details["heldout"] = {"num_examples": len(heldout["row_id"]),
                                                 "num_truncated": sum(heldout["truncated"]),
                                                 "num_dropped_prompt_too_long": len(heldout_too_long)}
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
