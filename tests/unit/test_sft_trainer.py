"""Trainer arithmetic against hand-computed values: LR schedule, loss normalisation over micro-batches and ranks,
deterministic data order and sharding, resume bookkeeping (the typed trainer state), and the step's metric sums."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from sft.checkpoint import TRAINER_STATE_FILE, Checkpointer, ResumeError, TrainerState
from sft.data import IGNORE_INDEX, DataOrder, SFTDataError, TokenisedRow, collate, supervised_token_count
from sft.distributed import close_distributed, init_distributed
from sft.optim import lr_multiplier, num_warmup_steps
from sft.trainer import SUPERSEDED_METRICS_FILE, StepMetrics, keep_metrics_up_to, micro_batch_weight


# ------------------------------------------------------------------------------------------ LR schedule
def test_warmup_steps_round_up():
    assert num_warmup_steps(375, 0.01) == 4  # ⌈3.75⌉: the paper's 1% of 375 steps
    assert num_warmup_steps(10, 0.0) == 0


@pytest.mark.parametrize("step, expected", [
    (0, 1 / 4), (1, 2 / 4), (2, 3 / 4),           # warm-up (step + 1) / (3 + 1)
    (3, 1.0),                                    # cosine starts at the peak
    (5, 0.5 * (1 + math.cos(math.pi / 4))),      # progress (5 − 3) / 8 = 1/4 → 0.853553
    (7, 0.5),                                    # progress 1/2
    (10, 0.5 * (1 + math.cos(math.pi * 7 / 8))),  # last step: 0.038060
])
def test_cosine_schedule_with_warmup(step, expected):
    assert lr_multiplier(step, total_steps=11, warmup_steps=3, schedule="cosine", min_lr_ratio=0.0) == \
        pytest.approx(expected, abs=1e-12)


def test_cosine_floor_and_constant_schedule():
    # min_lr_ratio 0.1 at progress 1/2: 0.1 + 0.9 · 0.5 = 0.55
    assert lr_multiplier(7, total_steps=11, warmup_steps=3, schedule="cosine", min_lr_ratio=0.1) == pytest.approx(0.55)
    assert lr_multiplier(1, total_steps=11, warmup_steps=3, schedule="constant", min_lr_ratio=0.0) == 0.5
    assert lr_multiplier(9, total_steps=11, warmup_steps=3, schedule="constant", min_lr_ratio=0.0) == 1.0
    assert lr_multiplier(0, total_steps=5, warmup_steps=0, schedule="cosine", min_lr_ratio=0.0) == 1.0


# ----------------------------------------------------------------------------------- loss normalisation
def test_micro_batch_weights_hand_values():
    assert micro_batch_weight("micro_batch_mean", num_tokens=3, step_tokens=12, grad_accum=4, world_size=2) == 1 / 8
    assert micro_batch_weight("micro_batch_sum", num_tokens=3, step_tokens=12, grad_accum=4, world_size=2) == 1 / 2
    assert micro_batch_weight("global_token_mean", num_tokens=3, step_tokens=12, grad_accum=4, world_size=2) == 1 / 4
    with pytest.raises(ValueError, match="sft.loss_norm"):
        micro_batch_weight("token_sum", num_tokens=3, step_tokens=12, grad_accum=4, world_size=2)


def test_optimizer_batch_parts_sum_over_micro_batches_and_ranks():
    # each micro-batch's loss is its part of the step's one objective: weight 1, so J = Σ_ranks Σ_m L_m
    assert micro_batch_weight("optimizer_batch_parts", num_tokens=3, step_tokens=12, grad_accum=4, world_size=2) == 1.0


def _batch():
    """8 sequences of length 4 over a 5-token vocabulary with 3, 1, 2, 0, 3, 2, 1, 3 supervised predictions."""
    torch.manual_seed(0)
    hidden = torch.randn(8, 4, 3)
    labels = torch.full((8, 4), IGNORE_INDEX)
    for row, count in enumerate([3, 1, 2, 0, 3, 2, 1, 3]):
        labels[row, 4 - count:] = torch.randint(0, 5, (count,))
    return hidden, labels


def _token_mean_ce(head: torch.Tensor, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Plain SFT's micro-batch objective: mean CE over the micro-batch's supervised predictions."""
    logits = hidden[:, :-1] @ head.T
    return F.cross_entropy(logits.reshape(-1, 5), labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)


def _step_gradient(loss_norm: str, world_size: int, grad_accum: int):
    """Objective and head gradient of one step of 4 micro-batches of 2, FSDP-style: each rank back-propagates
    world_size · w_m · L_m and the gradients are averaged over ranks."""
    hidden, labels = _batch()
    head = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)).requires_grad_()
    micro = [(hidden[i:i + 2], labels[i:i + 2]) for i in range(0, 8, 2)]
    step_tokens = sum(supervised_token_count(lab) for _, lab in micro)
    objective, rank_grads = 0.0, []
    for rank in range(world_size):
        head.grad = None
        for h, lab in micro[rank::world_size]:
            weight = micro_batch_weight(loss_norm, num_tokens=supervised_token_count(lab), step_tokens=step_tokens,
                                        grad_accum=grad_accum, world_size=world_size)
            loss = _token_mean_ce(head, h, lab)
            (loss * weight * world_size).backward()
            objective += weight * loss.item()
        rank_grads.append(head.grad.clone())
    return objective, torch.stack(rank_grads).mean(0), head, hidden, labels


@pytest.mark.parametrize("world_size, grad_accum", [(1, 4), (2, 2), (4, 1)])
def test_global_token_mean_of_micro_batches_equals_one_batch_for_plain_sft(world_size, grad_accum):
    objective, grad, head, hidden, labels = _step_gradient("global_token_mean", world_size, grad_accum)
    whole = _token_mean_ce(head, hidden, labels)  # one batch of 8: mean over its 15 supervised tokens
    (whole_grad,) = torch.autograd.grad(whole, head)
    assert objective == pytest.approx(whole.item(), abs=1e-6)
    torch.testing.assert_close(grad, whole_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("world_size, grad_accum", [(1, 4), (2, 2)])
def test_micro_batch_mean_and_sum_weight_every_micro_batch_equally(world_size, grad_accum):
    hidden, labels = _batch()
    head = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    per_micro = [_token_mean_ce(head, hidden[i:i + 2], labels[i:i + 2]).item() for i in range(0, 8, 2)]
    mean_objective, *_ = _step_gradient("micro_batch_mean", world_size, grad_accum)
    sum_objective, *_ = _step_gradient("micro_batch_sum", world_size, grad_accum)
    assert mean_objective == pytest.approx(sum(per_micro) / 4, abs=1e-6)
    assert sum_objective == pytest.approx(sum(per_micro) / world_size, abs=1e-6)  # ×grad_accum the mean
    # with uneven token counts (4, 2, 5, 4) the micro-batch mean is not the token mean of the batch
    assert mean_objective != pytest.approx(_token_mean_ce(head, hidden, labels).item(), abs=1e-3)


# ------------------------------------------------------------------------------------------- data order
LENGTHS = [5, 9, 3, 7, 11, 4, 8, 6, 10, 2, 12, 1, 13, 14]  # 14 rows


def _order(world_size: int, grad_accum: int, seed: int = 7) -> DataOrder:
    return DataOrder(LENGTHS, micro_batch_size=2, grad_accum=grad_accum, world_size=world_size, order_seed=seed)


def test_data_order_is_deterministic_and_reshuffled_every_epoch():
    assert _order(1, 2).epoch_order(0) == _order(1, 2).epoch_order(0)
    assert _order(1, 2).epoch_order(0) != _order(1, 2, seed=8).epoch_order(0)
    assert _order(1, 2).epoch_order(0) != _order(1, 2).epoch_order(1)
    assert sorted(_order(1, 2).epoch_order(1)) == list(range(14))


def test_steps_cover_distinct_rows_longest_first():
    order = _order(1, 2)
    assert order.global_batch == 4 and order.steps_per_epoch == 3  # 14 // 4; 2 rows unused per epoch
    seen = []
    for step in range(3):
        micro = order.step_micro_batches(step)
        flat = [row for mb in micro for row in mb]
        assert [len(mb) for mb in micro] == [2, 2]
        assert [LENGTHS[r] for r in flat] == sorted((LENGTHS[r] for r in flat), reverse=True)
        assert sorted(flat) == sorted(order.epoch_order(0)[4 * step:4 * step + 4])
        seen += flat
    assert len(set(seen)) == 12


def test_ranks_split_the_same_micro_batches_as_one_rank():
    one_rank, two_ranks = _order(1, 2), _order(2, 1)
    for step in range(4):
        shards = [two_ranks.rank_micro_batches(step, rank) for rank in (0, 1)]
        assert shards[0] == one_rank.step_micro_batches(step)[0::2]
        assert shards[1] == one_rank.step_micro_batches(step)[1::2]
        assert sorted(shards[0] + shards[1]) == sorted(one_rank.rank_micro_batches(step, 0))


def test_position_is_a_function_of_the_step_count():
    order = _order(1, 2)  # 3 steps per epoch, 4 rows per step
    assert order.position(0) == (0, 0)
    assert order.position(2) == (0, 8)
    assert order.position(3) == (1, 0)  # after the last step of epoch 0: start of epoch 1, not "end of epoch 0"
    assert order.position(4) == (1, 4)
    first_of_epoch_1 = [row for mb in order.step_micro_batches(3) for row in mb]
    assert sorted(first_of_epoch_1) == sorted(order.epoch_order(1)[:4])


def test_too_few_rows_for_one_step_names_the_keys():
    with pytest.raises(SFTDataError, match="sft.micro_batch_size"):
        DataOrder([3, 4, 5], micro_batch_size=2, grad_accum=2, world_size=1, order_seed=0)


def test_collate_pads_right_to_the_micro_batch_longest():
    rows = [TokenisedRow("a", (5, 6, 7), (-100, 6, 7)), TokenisedRow("b", (8, 9), (-100, 9))]
    batch = collate(rows, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [-100, 9, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert supervised_token_count(batch["labels"]) == 3  # targets 6, 7 and 9
    assert collate(rows[:1], pad_token_id=0)["attention_mask"] is None


# ---------------------------------------------------------------------------------------- resume records
def test_superseded_metrics_move_aside(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in range(1, 6)))
    keep_metrics_up_to(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    superseded = (tmp_path / SUPERSEDED_METRICS_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in superseded] == [4, 5]


def test_only_checkpoints_with_a_state_file_count(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=2, env=None)
    for step in (3, 4, 6):
        checkpointer.path(step).mkdir(parents=True)
    for step in (3, 4):  # step 6 was interrupted before its state file was written
        (checkpointer.path(step) / TRAINER_STATE_FILE).write_text("{}")
    assert checkpointer.complete_steps() == [3, 4]


def test_a_torn_state_file_makes_its_checkpoint_damaged_by_name(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=2, env=None)
    checkpointer.path(4).mkdir(parents=True)
    (checkpointer.path(4) / TRAINER_STATE_FILE).write_text('{"global_step": 4, "fil')
    assert checkpointer.damage(checkpointer.path(4)).startswith(
        f"{checkpointer.path(4) / TRAINER_STATE_FILE} is not readable")
    (checkpointer.path(4) / TRAINER_STATE_FILE).write_text(json.dumps(OLD_STATE))
    assert checkpointer.damage(checkpointer.path(4)) is None  # written before the digests: nothing to verify


# ------------------------------------------------------------------------------------- trainer state
OLD_STATE = {"epoch": 1, "global_step": 4, "index_in_epoch": 0, "input_tokens": 812, "last_loss": 5.25,
             "supervised_tokens": 301, "total_steps": 8, "train_time_s": 1.5, "world_size": 1}
"""A ``trainer_state.json`` as the trainer wrote it while the state was a dict (indent 2, sorted keys)."""


def test_state_files_written_before_the_typed_state_still_load(tmp_path):
    path = tmp_path / TRAINER_STATE_FILE
    path.write_text(json.dumps(OLD_STATE, indent=2, sort_keys=True))
    state = TrainerState.read(path)
    assert (state.global_step, state.epoch, state.supervised_tokens, state.last_loss) == (4, 1, 301, 5.25)
    assert state.to_json() == path.read_text()


@pytest.mark.parametrize("text, message", [
    (json.dumps({k: v for k, v in OLD_STATE.items() if k != "epoch"}), "another version of the trainer"),
    ("{not json", "not a readable trainer state"),
])
def test_a_state_file_that_is_not_one_is_refused_by_name(tmp_path, text, message):
    path = tmp_path / TRAINER_STATE_FILE
    path.write_text(text)
    with pytest.raises(ResumeError, match=message) as error:
        TrainerState.read(path)
    assert str(path) in str(error.value)


# ------------------------------------------------------------------------------------- step metrics
@pytest.fixture
def one_rank_group():
    env = init_distributed("cpu")
    yield env
    close_distributed(env)


def test_step_metrics_sum_the_objective_and_average_metrics_over_micro_batches(one_rank_group):
    metrics = StepMetrics(one_rank_group.device)
    metrics.add(0.25, torch.tensor(2.0, requires_grad=True), {"ce": torch.tensor(1.0), "n": torch.tensor(3)})
    metrics.add(0.75, torch.tensor(4.0), {"n": torch.tensor(5), "ce": torch.tensor(2.0)})
    objective, means = metrics.reduce()
    assert objective == 0.25 * 2.0 + 0.75 * 4.0
    assert means == {"ce": 1.5, "n": 4.0} and list(means) == ["ce", "n"]
    with pytest.raises(ValueError, match="differ from the step's first"):
        metrics.add(1.0, torch.tensor(1.0), {"ce": torch.tensor(1.0)})
