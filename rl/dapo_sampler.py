"""DAPO's dynamic sampling with a bound: verl 0.9.1's sync replay buffer that counts the prompt groups it judges.

verl loads this class as its replay buffer (``trainer.v1.sampler.custom_sampler``, set by ``rl/verl_args.py`` when
``rl.filter_groups`` is on) inside its trainer process. Sampling is verl's own (``ReplayBuffer.sample``: keep the
groups whose rollouts got both verdicts, evict the uniform ones and dispatch two new prompts for each, until
``rl.train_batch_size`` mixed groups are finished); this subclass only counts. Every ``rl.train_batch_size`` groups
judged in a step are one *generation batch*: after each it prints a progress line (step, generation batch, mixed
groups kept, the all-right / all-wrong shares), and after ``rl.max_gen_batches`` of them without enough mixed groups
it prints why and raises, which ends verl. verl's V1 trainer ignores ``max_num_gen_batches``, so without this a start
model that answers every prompt the same way regenerates forever.
"""
from __future__ import annotations

from collections import Counter

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from rl.verl_args import DAPO_PROGRESS_PREFIX, DAPO_STOPPED_PREFIX


class DynamicSamplingExhausted(RuntimeError):
    """``rl.max_gen_batches`` generation batches did not yield a step's mixed groups."""


class BoundedDapoReplayBuffer(ReplayBuffer):
    """verl's sync ``ReplayBuffer`` with group filtering; ``sampler_kwargs`` (``trainer.v1.sampler.sampler_kwargs``)
    carry what verl passes its built-in buffer (``metric``, ``train_batch_size``, ``max_inflight_gen_batches``) plus
    ``max_gen_batches`` (0: unbounded), the metric's values of a right and a wrong rollout, and ``poll_interval_s``
    (``rl.sampler_poll_s``: verl passes a custom sampler no poll interval, and its default of 2 s made every refill
    wave of a 2-core toy run wait a second on average)."""

    def __init__(self, *, sampler_kwargs, **verl_kwargs):
        options = dict(sampler_kwargs)
        if "poll_interval_s" in options:
            verl_kwargs["poll_interval"] = float(options["poll_interval_s"])
        super().__init__(sampler_kwargs=sampler_kwargs, filter_groups_metric=str(options["metric"]),
                         train_batch_size=int(options["train_batch_size"]), gen_batch_size=1,
                         max_inflight_gen_batches=int(options["max_inflight_gen_batches"]), **verl_kwargs)
        self.max_gen_batches = int(options["max_gen_batches"])
        self.right_value, self.wrong_value = float(options["right_value"]), float(options["wrong_value"])
        self._step, self._needed, self._batches = 0, 0, 0
        self._uniform: Counter = Counter()
        """Uniform groups evicted in this step, by the metric value all their rollouts share."""

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        if partition_id != "val":
            self._step, self._needed, self._batches, self._uniform = global_steps, batch_size, 0, Counter()
        return super().sample(global_steps, partition_id, batch_size)

    def _evict_terminal_groups(self, global_steps, partition_id, eviction_reasons):
        if partition_id != "val":
            self._uniform.update(eviction_reasons[3])  # {shared metric value: groups}, each group evicted once
        return super()._evict_terminal_groups(global_steps, partition_id, eviction_reasons)

    def _sampleable_terminal_keys(self, partition_id, eviction_reasons):
        sampleable = super()._sampleable_terminal_keys(partition_id, eviction_reasons)
        if partition_id != "val" and self._needed:
            self._count(len(sampleable))
        return sampleable

    def _count(self, kept: int) -> None:
        judged = kept + sum(self._uniform.values())
        batches = judged // self._needed
        if batches <= self._batches:
            return
        self._batches = batches
        right, wrong = (self._uniform[value] / judged for value in (self.right_value, self.wrong_value))
        shares = f"{right:.0%} all right, {wrong:.0%} all wrong"
        print(f"{DAPO_PROGRESS_PREFIX}step {self._step}: generation batch {batches}: {min(kept, self._needed)}/"
              f"{self._needed} mixed groups kept ({shares})", flush=True)
        if self.max_gen_batches and batches >= self.max_gen_batches and kept < self._needed:
            verdict = "right" if right >= wrong else "wrong"
            message = (f"DAPO's dynamic sampling judged {judged} prompt groups at step {self._step} "
                       f"({batches} generation batches of rl.train_batch_size={self._needed}, rl.max_gen_batches="
                       f"{self.max_gen_batches}) and kept {kept} of the {self._needed} mixed groups a step needs: "
                       f"{shares}. The model answers nearly every RL prompt {verdict} on all of its tries, so no "
                       f"group has an advantage to learn from. Start from a stronger model (more SFT), use an "
                       f"{'easier' if verdict == 'wrong' else 'harder'} RL set, raise rl.max_gen_batches, or "
                       f"train on every group with rl.filter_groups=false")
            print(DAPO_STOPPED_PREFIX + message, flush=True)
            raise DynamicSamplingExhausted(message)
