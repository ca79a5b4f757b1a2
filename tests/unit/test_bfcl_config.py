"""The tool-use configuration (issue 16): data sources, the tools-aware template, BFCL benchmarks, run identity."""
from __future__ import annotations

import pytest

from common.config import ConfigError, compose
from common.config.common import computation_config
from common.config.data import CHATML_TOOLS_TEMPLATE, BenchmarkSource, DataConfig
from common.paths import data_run


def test_tool_sources_compose():
    cfg = compose(["experiment=bfcl", "profile=paper"])
    assert (cfg.data.source, cfg.data.hub_id, cfg.data.benchmark_source) == ("acebench", "oliveirabruno01/acebench",
                                                                             "bfcl")
    assert list(cfg.data.benchmarks) == ["live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
                                         "live_irrelevance"]
    assert (cfg.eval.n, cfg.eval.temperature) == (1, 0.0)
    synthetic = compose(["experiment=bfcl", "profile=toy", "data=synthetic_tools"])
    assert (synthetic.data.source, synthetic.data.num_sft_rows) == ("synthetic_tools", 200)
    assert synthetic.data.tool_chat_template() == CHATML_TOOLS_TEMPLATE
    assert cfg.data.tool_chat_template() is None


@pytest.mark.parametrize("overrides, key", [
    (["data.tool_template=qwen"], "data.tool_template"),
    (["data=openr1", "data.tool_template=chatml_tools"], "data.tool_template"),
    (["experiment=bfcl", "data.hub_id="], "data.hub_id"),
    (["data=openr1", "data.benchmark_source=bfcl"], "data.benchmark_source=bfcl goes with"),
])
def test_invalid_tool_settings_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        compose(overrides)


def test_bfcl_benchmarks_must_be_bfcl_categories():
    data = DataConfig(source="synthetic_tools", benchmark_source="bfcl",
                      benchmarks={"live_simple": BenchmarkSource(), "live_banana": BenchmarkSource()})
    with pytest.raises(ConfigError, match=r"data.benchmarks.live_banana \(a BFCL category\)"):
        data.validate()


def test_acebench_local_folder_needs_no_hub_id():
    cfg = compose(["experiment=bfcl", "data.hub_id=", "data.path=/some/acebench/data_en"])
    assert cfg.data.path == "/some/acebench/data_en"


def test_tool_template_enters_the_identity_only_when_set():
    assert "tool_template" not in computation_config(DataConfig())
    assert computation_config(DataConfig(tool_template="chatml_tools"))["tool_template"] == "chatml_tools"
    for overrides in (["experiment=demo"], ["experiment=table1", "profile=paper"]):
        assert "tool_template" not in data_run(compose(overrides)).config["data"]
    plain = data_run(compose(["experiment=bfcl", "data=synthetic_tools", "data.tool_template="]))
    templated = data_run(compose(["experiment=bfcl", "data=synthetic_tools"]))
    assert plain.directory != templated.directory


def test_bfcl_paper_dry_run_lists_methods_models_and_both_bfcl_subsets(tmp_path, capsys):
    from pipeline.run import run, stage_overrides

    overrides = ["experiment=bfcl", "profile=paper", f"experiment.run_root={tmp_path}", "dry_run=true"]
    plan = run(compose(overrides), stage_overrides(overrides))
    shown = capsys.readouterr().out
    names = [c.name for c in plan]
    assert names[0] == "data" and names[-1] == "report"
    for model in ("qwen3_4b", "qwen3_8b"):
        for label in ("sft", "dft", "eksft", "eksft_compatofficial_code"):
            assert f"sft/{model}/{label}" in names and f"eval/{model}/sft/{label}" in names
        assert f"eval/{model}/sft/base" in names
    assert not any(c.stage in ("rl", "eval_rl") for c in plan)
    evals = [c for c in plan if c.stage == "eval_sft"]
    assert len(evals) == 2 * 5
    for command in evals:
        assert [d.name for d in command.manifest_dirs] == ["live_simple", "live_multiple", "live_parallel",
                                                           "live_parallel_multiple", "live_irrelevance"]
        assert command.settings["sampling"]["n"] == 1 and command.settings["sampling"]["temperature"] == 0.0
    assert "live_irrelevance" in shown and "live_parallel_multiple" in shown and "sft/method=eksft_official" in shown
