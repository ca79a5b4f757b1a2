"""Token-probability case study (paper App. "Case Study"): the probability each model assigns to every token of
one ground-truth solution under teacher forcing, p_m(y_t | x, y_<t), for the base model and each SFT export.

The solution is one row of the tokenised SFT split the data stage wrote (``data/<model>/sft_tokens.parquet``:
``input_ids`` and unshifted ``labels``, -100 off the response), so every model sees exactly the training tokens.
Only the first ``max_tokens`` response tokens are scored. Rendered as a PNG heatmap (rows = models, columns =
tokens, white → dark red as p goes 0 → 1) and an HTML page with one coloured span per token and p on hover.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

from report.analyses import AnalysisInputError, pyplot, save_figure
from common.models import load_causal_lm
from common.paths import IGNORE_INDEX

TOKEN_TEXT_LIMIT = 96
"""Up to this many tokens the heatmap's x axis shows each token's text; beyond it, token indices."""


@dataclass
class CaseStudyTokens:
    """The scored part of one solution."""

    row_id: str
    input_ids: list[int]
    """Prompt and response up to the last scored token."""
    positions: list[int]
    """Indices into ``input_ids`` of the scored response tokens."""


def read_case_study_row(path: Path, row: int, max_tokens: int) -> CaseStudyTokens:
    """Row ``row`` of the tokenised SFT split, cut after its first ``max_tokens`` supervised tokens."""
    import pyarrow.parquet as pq

    if not path.exists():
        raise AnalysisInputError(f"{path}: tokenised SFT split not found (run the data stage's tokenize step)")
    table = pq.read_table(path, columns=["row_id", "input_ids", "labels"])
    if row >= table.num_rows:
        raise AnalysisInputError(f"report.analysis.case_study_row={row} but {path} has {table.num_rows} rows")
    record = table.slice(row, 1).to_pylist()[0]
    positions = [i for i, label in enumerate(record["labels"]) if label != IGNORE_INDEX and i > 0][:max_tokens]
    if not positions:
        raise AnalysisInputError(f"{path} row {row} ({record['row_id']}): no supervised response token")
    return CaseStudyTokens(row_id=str(record["row_id"]), input_ids=list(record["input_ids"][:positions[-1] + 1]),
                           positions=positions)


def token_probabilities(model_folder: str | Path, tokens: CaseStudyTokens, device: str, dtype: str) -> list[float]:
    """p(y_t | y_<t) for every scored position t: softmax of the logits at t − 1, taken at ``input_ids[t]``."""
    import torch

    model = load_causal_lm(model_folder, dtype=dtype).to(device).eval()
    ids = torch.tensor([tokens.input_ids], device=device)
    positions = torch.tensor(tokens.positions, device=device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, positions - 1].float()
    probabilities = logits.log_softmax(-1).gather(-1, ids[0, positions].unsqueeze(-1)).squeeze(-1).exp()
    del model
    return probabilities.cpu().tolist()


def token_texts(model_folder: str | Path, tokens: CaseStudyTokens) -> list[str]:
    """Each scored token decoded on its own (newlines shown as ↵)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    return [tokenizer.decode([tokens.input_ids[t]]).replace("\n", "↵") for t in tokens.positions]


def write_case_study(probabilities: dict[str, list[float]], texts: list[str], title: str,
                     png_path: Path, html_path: Path, json_path: Path) -> None:
    """Heatmap PNG, hoverable HTML and the raw numbers (JSON) of ``probabilities`` (model label → p per token)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"tokens": texts, "probabilities": probabilities}, indent=1) + "\n",
                         encoding="utf-8")
    _heatmap(probabilities, texts, title, png_path)
    html_path.write_text(_html(probabilities, texts, title), encoding="utf-8")


def _heatmap(probabilities: dict[str, list[float]], texts: list[str], title: str, path: Path) -> None:
    plt = pyplot()
    labels = list(probabilities)
    figure, axes = plt.subplots(figsize=(max(6.0, 2.0 + 0.16 * len(texts)), 1.6 + 0.35 * len(labels)), dpi=100)
    image = axes.imshow([probabilities[label] for label in labels], cmap="Reds", vmin=0.0, vmax=1.0, aspect="auto",
                        interpolation="nearest")
    axes.set_yticks(range(len(labels)), labels, fontsize=8)
    if len(texts) <= TOKEN_TEXT_LIMIT:
        # "$" would switch matplotlib to mathtext; a blank token gets a visible mark.
        axes.set_xticks(range(len(texts)), [text.replace("$", r"\$") if text.strip() else "␣" for text in texts],
                        rotation=90, fontsize=7)
    else:
        axes.set_xlabel("response token")
    axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.02, pad=0.01, label="p(ground-truth token)")
    save_figure(figure, path)


def _html(probabilities: dict[str, list[float]], texts: list[str], title: str) -> str:
    rows = []
    for label, values in probabilities.items():
        spans = "".join(
            f'<span style="background: rgba(200, 0, 0, {p:.3f}); color: {"#fff" if p > 0.6 else "#000"}" '
            f'title="{html.escape(label)} · token {i}: p = {p:.4f}">{html.escape(text) or "&nbsp;"}</span>'
            for i, (text, p) in enumerate(zip(texts, values)))
        rows.append(f"<tr><th>{html.escape(label)}</th><td>{spans}</td></tr>")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html.escape(title) + "</title>\n"
            "<style>body{font-family:sans-serif} th{text-align:left;padding-right:1em;vertical-align:top}"
            " td{font-family:monospace;white-space:pre-wrap;line-height:1.6} span{padding:1px 0}</style></head>\n"
            f"<body><h3>{html.escape(title)}</h3><p>Background: p(ground-truth token | prefix), white = 0, "
            "dark red = 1; hover a token for its value.</p>\n<table>\n" + "\n".join(rows) + "\n</table></body></html>\n")
