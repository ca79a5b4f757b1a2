"""Every table of the paper in report/paper_tables.json re-parsed from the paper's .tex (../shared/docs): its numbers,
Tables 1-2's bold marks against ours, and the hyperparameter tables against the paper profile's configs."""
from __future__ import annotations

import re

import pytest

from report.tables import load_paper_tables, rank_marks

COLUMNS = ["AIME", "AIME25", "AMC", "HMMT25", "Avg"]
METHOD_TITLES = {"{\\ourtitle}": "EKSFT", "\\ourtitle": "EKSFT", "\\&": "&", "\\%": "%"}


def _tabular(tex: str, label: str) -> str:
    """The tabular body of the table labelled ``label``."""
    end = tex.index(f"\\label{{{label}}}")
    start = tex.rindex("\\begin{tabular}", 0, end)
    return tex[start:tex.index("\\end{tabular}", start)]


def _method(cell: str) -> str:
    for tex, text in METHOD_TITLES.items():
        cell = cell.replace(tex, text)
    return cell.strip()


def _parse_paper_table(tex: str, label: str, columns: list[str] = COLUMNS, model: str | None = None
                       ) -> tuple[dict, dict]:
    """{model: {method: {column: {metric: value}}}} and {model: {method: {(column, metric): mark}}} of one table of
    pass@1 / pass@32 pairs over ``columns``; ``model`` for a table without model rows (the paper's Qwen3-4B
    appendix tables)."""
    values: dict = {}
    marks: dict = {}
    width = 1 + 2 * len(columns)
    for line in _tabular(tex, label).splitlines():
        title = re.search(r"\\textit\{([^}]*)\}", line)
        if "\\multicolumn" in line and title:
            model = title.group(1)
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)&", line.strip().removesuffix("\\\\"))]
        if model is None or len(cells) != width or cells[1] == "pass@1":
            continue
        method = _method(cells[0])
        row, row_marks = {}, {}
        for index, cell in enumerate(cells[1:]):
            column, metric = columns[index // 2], ("pass@1", "pass@32")[index % 2]
            number = float(re.sub(r"\\(textbf|underline)\{([^}]*)\}", r"\2", cell))
            row.setdefault(column, {})[metric] = number
            row_marks[(column, metric)] = "best" if "textbf" in cell else "second" if "underline" in cell else ""
        values.setdefault(model, {})[method] = row
        marks.setdefault(model, {})[method] = row_marks
    return values, marks


@pytest.fixture(scope="module")
def paper_tex(shared_data) -> str:
    return (shared_data.parent / "docs" / "eksft_paper.tex").read_text(encoding="utf-8")


@pytest.mark.parametrize("phase, label", [("sft", "tab:stage1"), ("rl", "tab:stage2")])
def test_paper_tables_json_matches_the_tex(paper_tex, phase, label):
    values, _ = _parse_paper_table(paper_tex, label)
    assert load_paper_tables()[phase] == values
    assert set(values) == {"Qwen3-4B", "Qwen3-8B"} and all(len(rows) == 6 for rows in values.values())


@pytest.mark.parametrize("phase, label", [("sft", "tab:stage1"), ("rl", "tab:stage2")])
def test_our_bold_marks_match_the_papers(paper_tex, phase, label):
    values, marks = _parse_paper_table(paper_tex, label)
    for model, rows in values.items():
        methods = list(rows)
        for column in COLUMNS:
            for metric in ("pass@1", "pass@32"):
                ours = rank_marks([rows[m][column][metric] for m in methods])
                paper_best = [marks[model][m][(column, metric)] == "best" for m in methods]
                assert [mark == "best" for mark in ours] == paper_best, (model, column, metric)


@pytest.mark.parametrize("key, columns, model, rows", [
    ("ablation", COLUMNS[:4], None, 4), ("ablation_masking", COLUMNS[:4], None, 2),
    ("ratio", COLUMNS[:3], "Qwen3-4B", 5), ("random_mask", COLUMNS[:3], "Qwen3-4B", 2)])
def test_the_ablation_tables_match_the_tex(paper_tex, key, columns, model, rows):
    values, _ = _parse_paper_table(paper_tex, f"tab:{key}", columns, model)
    assert load_paper_tables()[key] == values
    assert all(len(by_method) == rows for by_method in values.values())


def test_the_rho_table_repeats_table1s_sft_and_eksft_rows(paper_tex):
    """Why the ratio table reuses Table 1's runs: its ρ = 0.0 row is the paper's SFT row and ρ = 0.2 its EKSFT row."""
    tables = load_paper_tables()
    ratio, table1 = tables["ratio"]["Qwen3-4B"], tables["sft"]["Qwen3-4B"]
    for rho, method in (("0.0", "SFT"), ("0.2", "EKSFT (Ours)")):
        assert ratio[rho] == {column: table1[method][column] for column in ratio[rho]}


def test_the_iou_and_bfcl_tables_match_the_tex(paper_tex):
    iou = dict(re.findall(r"^(Max|Min|Avg) & ([0-9.]+)", _tabular(paper_tex, "tab:iou"), re.M))
    assert load_paper_tables()["iou"] == {stat: float(value) for stat, value in iou.items()}
    bfcl = {}
    for label, model in (("tab:bfcl_4b", "Qwen3-4B"), ("tab:bfcl_8b", "Qwen3-8B")):
        for method, live, irrelevance in re.findall(r"^(.+?) & (.+?) & (.+?) \\\\", _tabular(paper_tex, label), re.M):
            if method.startswith("\\textbf{Method"):
                continue
            bfcl.setdefault(model, {})[_method(method)] = {"BFCL live": {"accuracy": _bold_number(live)},
                                                           "Irrelevance Det.": {"accuracy": _bold_number(irrelevance)}}
    assert load_paper_tables()["bfcl"] == bfcl


def _bold_number(cell: str) -> float:
    return float(re.sub(r"\\textbf\{([^}]*)\}", r"\1", cell))


def _tex_number(text: str) -> float | str:
    """``$1\\times10^{-6}$`` and ``$1\\mathrm{e}{-}5$`` → 1e-06 / 1e-05; integers as numbers; the rest as printed."""
    text = text.strip().strip("$")
    power = re.fullmatch(r"([0-9.]+)\\times10\^\{(-?[0-9]+)\}", text) or \
        re.fullmatch(r"([0-9.]+)\\mathrm\{e\}\{-\}([0-9]+)", text)
    if power:
        exponent = int(power.group(2))
        return float(power.group(1)) * 10.0 ** (exponent if "times" in text else -exponent)
    return int(text) if text.isdigit() else text


def _settings(text: str) -> dict:
    """``$kl=0.0, c_l=0.2, c_h=0.28$`` → {kl: 0.0, c_l: 0.2, c_h: 0.28} (λ_H as lambda_H); ``-`` → {}."""
    text = text.strip().strip("$").replace("\\;", "").replace("\\lambda_{KL}", "lambda_KL") \
        .replace("\\lambda_H", "lambda_H").replace("\\rho", "rho")
    return {} if text == "-" else {key.strip(): float(value) for key, value in
                                   (item.split("=") for item in text.split(","))}


def test_the_hyperparameter_tables_match_the_tex(paper_tex):
    dapo = {}
    for name, value in re.findall(r"^(.+?) +& (.+?) \\\\", _tabular(paper_tex, "tab:hyperparameters_dapo"), re.M):
        if name != "\\textbf{Hyperparameter}":
            dapo[name] = _settings(value) if name == "Others" else _tex_number(value)
    assert load_paper_tables()["hyperparameters_dapo"] == dapo
    start = paper_tex.index("\\label{tab:hyperparameters}")
    body = paper_tex[start:paper_tex.index("\\end{table}", start)]
    methods = {}
    blocks = re.findall(r"^([^\n]+?) & \n\\begin\{tabular\}\[t\]\{l\}\n(.*?)\\end\{tabular\}", body, re.M | re.S)
    for method, block in blocks:
        settings = dict(line.removesuffix("\\\\").strip().split(": ", 1) for line in block.strip().splitlines())
        methods[_method(method)] = {key: _settings(value) if key == "Others" else _tex_number(value)
                                    for key, value in settings.items()}
    assert load_paper_tables()["hyperparameters"] == methods and len(methods) == 5


def test_the_paper_profile_trains_with_the_papers_hyperparameters():
    """Tables 4 and 5 (paper_tables.json) against conf/sft/paper.yaml, conf/rl/dapo.yaml and the method presets."""
    from common.config import compose

    tables = load_paper_tables()
    cfg = compose(["profile=paper"])
    sft = tables["hyperparameters"]["SFT"]
    assert (cfg.sft.lr, cfg.data.max_length, cfg.sft.grad_accum, cfg.sft.micro_batch_size, cfg.sft.epochs) == (
        sft["Learning Rate"], sft["Cutoff Length"], sft["Gradient Accumulation Steps"], sft["Batch Size"],
        sft["Epochs"])
    eksft = compose(["profile=paper", "sft/method=eksft"]).sft.method
    assert tables["hyperparameters"]["EKSFT"]["Others"] == {"lambda_H": eksft.lambda_entropy,
                                                           "lambda_KL": eksft.lambda_kl, "rho": eksft.rho}
    assert compose(["profile=paper", "sft/method=psft"]).sft.method.clip_high == \
        tables["hyperparameters"]["PSFT"]["Others"]["c_h"]
    dapo = tables["hyperparameters_dapo"]
    assert (cfg.rl.lr, cfg.rl.train_batch_size, cfg.rl.ppo_mini_batch_size, cfg.rl.total_steps, cfg.rl.rollout_n,
            cfg.rl.clip_ratio_low, cfg.rl.clip_ratio_high, cfg.rl.max_response_length) == (
        dapo["Learning Rate"], dapo["Train Batch Size"], dapo["PPO Mini-batch Size"], dapo["Total Steps"],
        dapo["Rollout Numbers"], dapo["Others"]["c_l"], dapo["Others"]["c_h"], 8 * 1024)
