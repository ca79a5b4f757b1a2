"""Issue 32.6: DAPO's dynamic sampling bounded. verl 0.9.1's own sync sampling loop (``ReplayBuffer.sample``) runs
through ``rl/dapo_sampler.py`` over an in-memory stand-in for the TransferQueue store, where every dispatched prompt
finishes at once with the verdicts a test chooses."""
from __future__ import annotations

import itertools

import pytest
from omegaconf import OmegaConf

from rl.verl_args import DAPO_PROGRESS_PREFIX, DAPO_SAMPLER, DAPO_STOPPED_PREFIX, build_overrides, validate_with_verl
from common.config import compose

ROLLOUTS = 4


class InstantRollouts:
    """The TransferQueue calls verl's replay buffer makes (``kv_list``, ``kv_batch_get``, ``kv_clear``), over prompts
    that finish as soon as they are dispatched; ``verdicts(index)`` gives the ``acc`` of each rollout of prompt
    ``index``."""

    def __init__(self, verdicts):
        self.verdicts = verdicts
        self.tags: dict[str, dict] = {}
        self.values: dict[str, dict] = {}
        self.dispatched = 0
        self._index = itertools.count()

    def dispatch(self, num_prompts: int) -> int:
        for _ in range(num_prompts):
            index = next(self._index)
            uid = f"p{index}"
            self.tags[uid] = {"is_prompt": True, "status": "finished", "global_steps": 1}
            for session, acc in enumerate(self.verdicts(index)):
                key = f"{uid}_{session}_0"
                self.tags[key] = {"status": "finished"}
                self.values[key] = {"reward_extra_info": {"acc": acc}}
        self.dispatched += num_prompts
        return num_prompts

    def kv_list(self):
        return {"train": dict(self.tags)}

    def kv_batch_get(self, keys, partition_id, select_fields):
        return {"extra_fields": [self.values[key] for key in keys]}

    def kv_clear(self, partition_id, keys):
        for key in keys:
            self.tags.pop(key, None)
            self.values.pop(key, None)


def _buffer(monkeypatch, store: InstantRollouts, max_gen_batches: int, batch_size: int = 8,
            poll_interval_s: float = 0.0):
    """The sampler as verl's trainer builds it (``_build_replay_buffer``: no ``poll_interval`` argument)."""
    from verl.trainer.ppo.v1 import replay_buffer
    from verl.utils.import_utils import load_extern_type

    monkeypatch.setattr(replay_buffer, "tq", store)
    cls = load_extern_type(str(DAPO_SAMPLER[0]), DAPO_SAMPLER[1])  # as verl loads it
    options = {"metric": "acc", "train_batch_size": batch_size, "max_inflight_gen_batches": 2,
               "max_gen_batches": max_gen_batches, "right_value": 1.0, "wrong_value": 0.0,
               "poll_interval_s": poll_interval_s}
    return cls(trainer_mode="sync", trainer_config=OmegaConf.create({}), max_off_policy_threshold=None,
               max_off_policy_strategy="drop", sampler_kwargs=OmegaConf.create(options), refill_fn=store.dispatch)


def test_a_model_that_answers_every_prompt_wrong_stops_after_the_bound_naming_the_shares(monkeypatch, capsys):
    # Issue 32.6: a weak start model never reached step 1 in 16 minutes; verl regenerated forever and said nothing.
    store = InstantRollouts(lambda index: [0.0] * ROLLOUTS if index % 10 else [1.0] * ROLLOUTS)
    buffer = _buffer(monkeypatch, store, max_gen_batches=5)
    store.dispatch(8)  # the step's first batch (verl's prepare_step)
    with pytest.raises(RuntimeError) as stopped:
        buffer.sample(global_steps=1, partition_id="train", batch_size=8)
    message = str(stopped.value)
    assert "at step 1 (5 generation batches of rl.train_batch_size=8, rl.max_gen_batches=5)" in message
    assert "kept 0 of the 8 mixed groups" in message and "10% all right, 90% all wrong" in message
    assert "easier RL set" in message and "rl.filter_groups=false" in message
    lines = capsys.readouterr().out.splitlines()
    progress = [line for line in lines if line.startswith(DAPO_PROGRESS_PREFIX + "step")]
    assert progress[0].startswith(f"{DAPO_PROGRESS_PREFIX}step 1: generation batch 1: 0/8 mixed groups kept")
    batches = [int(line.split("generation batch ")[1].split(":")[0]) for line in progress]
    assert batches == sorted(set(batches)) and batches[-1] == 5  # several batches may finish between two polls
    assert lines[-1] == DAPO_STOPPED_PREFIX + message
    assert 40 <= store.dispatched <= 40 + 2 * 8  # bounded: at most the in-flight refills beyond the fifth batch


def test_a_step_with_enough_mixed_groups_within_the_bound_is_verls_batch(monkeypatch, capsys):
    store = InstantRollouts(lambda index: [1.0, 0.0, 0.0, 0.0] if index % 3 == 0 else [0.0] * ROLLOUTS)
    buffer = _buffer(monkeypatch, store, max_gen_batches=10)
    store.dispatch(8)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=8)
    assert len({key.split("_")[0] for key in batch.keys}) == 8 and len(batch.keys) == 8 * ROLLOUTS
    assert metrics["training/filter_groups/evicted_samples"] >= 16  # two uniform groups per mixed one
    assert f"{DAPO_PROGRESS_PREFIX}step 1: generation batch 1:" in capsys.readouterr().out


class SlowRollouts(InstantRollouts):
    """Prompts that are still running when dispatched and finish at the sampler's next poll."""

    def dispatch(self, num_prompts: int) -> int:
        first = self.dispatched
        super().dispatch(num_prompts)
        for index in range(first, self.dispatched):
            self.tags[f"p{index}"]["status"] = "running"
        return num_prompts

    def finish_all(self) -> None:
        for tag in self.tags.values():
            tag["status"] = "finished"


def test_the_sampler_waits_rl_sampler_poll_s_between_its_looks_not_verls_two_seconds(monkeypatch):
    # A refill wave waits for the sampler's next look: verl gives a custom sampler no poll interval, so its default of
    # 2 s held every wave of the 2-core demo's DAPO steps up to 2 s (docs/results/2026-11-27-demo-latency.md).
    from verl.trainer.ppo.v1 import replay_buffer

    store = SlowRollouts(lambda index: [1.0, 0.0, 0.0, 0.0] if index % 2 == 0 else [0.0] * ROLLOUTS)
    buffer = _buffer(monkeypatch, store, max_gen_batches=10, poll_interval_s=0.25)
    waits = []

    def sleep(seconds):
        waits.append(seconds)
        store.finish_all()

    monkeypatch.setattr(replay_buffer.time, "sleep", sleep)
    store.dispatch(8)
    batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=8)
    assert len({key.split("_")[0] for key in batch.keys}) == 8
    assert len(waits) >= 2 and set(waits) == {0.25}


def test_verl_composes_the_bounded_sampler_with_our_options():
    cfg = compose(["profile=toy", "rl.max_gen_batches=7", "rl.sampler_poll_s=0.5"])
    sampler = validate_with_verl(build_overrides(cfg)).trainer.v1.sampler
    assert sampler.custom_sampler.name == DAPO_SAMPLER[1]
    assert dict(sampler.sampler_kwargs) == {"metric": "acc", "train_batch_size": cfg.rl.train_batch_size,
                                            "max_inflight_gen_batches": cfg.rl.max_inflight_gen_batches,
                                            "max_gen_batches": 7, "right_value": 1.0, "wrong_value": 0.0,
                                            "poll_interval_s": 0.5}
    off = validate_with_verl(build_overrides(compose(["profile=toy", "rl.filter_groups=false"])))
    assert off.trainer.v1.sampler.custom_sampler.path is None  # verl's own buffer without group filtering
