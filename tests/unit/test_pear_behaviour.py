"""PEAR with the data-generating policy (issue 40): the forking world's teacher writes its exact log-probabilities in
the SFT rows' ``behaviour_logprobs``, tokenisation puts them on the tokens, ``pear`` reads them (and refuses data
without them in the plan, naming the column), and today's arm is ``pear_base_ref`` (π_β = the base model)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from common.config import ConfigError, compose
from common.config.sft import PEARMethod
from common.paths import BEHAVIOUR_LOGPROBS_COLUMN, IGNORE_INDEX, method_label
from data.formatting import build_sft_example
from data.schema import InvalidRowError, check_row
from data.tokenize_sft import behaviour_token_logprobs
from pipeline.stages import check_behaviour_logprobs
from sft.data import TokenisedRow, collate
from sft.losses import PEARBehaviourLoss, PEARLoss, build_loss, compute_token_loss
from toy import forking
from common.config.toy import FORK_OPENINGS
from toy.forking import Problem
from toy.tokenizer import train_tokenizer

TEACHER = {"place": 0.9, "column": 0.1, "round": 0.0}


def test_the_teacher_rows_carry_its_exact_log_probabilities():
    rows = forking.teacher_rows(30, 3, TEACHER, verified=False)
    for index, row in enumerate(rows):
        check_row(row, index, "toy")
        opening, rest = row[BEHAVIOUR_LOGPROBS_COLUMN]
        strategy = next(s for s, text in FORK_OPENINGS.items() if text == opening["text"])
        assert opening["logprob"] == pytest.approx(math.log(TEACHER[strategy])) and rest["logprob"] == 0.0
    # verified: the teacher's draw conditioned on being right (a carry problem: place and column are both wrong)
    carry = Problem(75, 48)
    assert forking.behaviour_logprobs(carry, "round", {"place": 0.8, "column": 0.1, "round": 0.1}, True)[0][
        "logprob"] == 0.0
    broken = {**rows[0], BEHAVIOUR_LOGPROBS_COLUMN: [{"text": "Place", "logprob": -0.1}]}
    with pytest.raises(InvalidRowError, match="field 'behaviour_logprobs' segments' texts must concatenate"):
        check_row(broken, 0, "toy")


def test_tokenisation_puts_each_segment_on_the_token_it_starts_in():
    tokenizer = train_tokenizer(itertools.islice(forking.documents(0, forking.ForkingMix(0.5, 0.5)), 400), 512)
    row = forking.teacher_rows(1, 0, {"column": 1.0}, verified=False)[0]
    row = {**row, "row_id": 0, BEHAVIOUR_LOGPROBS_COLUMN: [{"text": "Column:", "logprob": -2.0},
                                                           {"text": row["target"][0]["content"][7:], "logprob": -0.5}]}
    example = build_sft_example(tokenizer, row["prompt"], row["target"][0]["content"], 512)
    per_token = behaviour_token_logprobs(tokenizer, row, example, "auto")
    prompt = len(example.input_ids) - example.num_response_tokens
    assert len(per_token) == len(example.input_ids) and all(math.isnan(v) for v in per_token[:prompt])
    response = per_token[prompt:]
    assert response[0] == -2.0 and sum(response) == pytest.approx(-2.5) and response[-1] == 0.0  # end of turn: 0


def test_pear_reads_the_behaviour_log_probs_and_pear_base_ref_the_reference():
    logits = torch.randn(2, 5, 7)
    ref = torch.randn(2, 5, 7)
    labels = torch.tensor([[IGNORE_INDEX, 1, 2, 3, 4], [IGNORE_INDEX, IGNORE_INDEX, 0, 6, 5]])
    ref_logp = torch.log_softmax(ref, -1)
    # the behaviour log-prob of token t sits at its own position (as in the tokens file), NaN on the prompt
    behaviour = torch.full((2, 5), math.nan)
    behaviour[:, 1:] = ref_logp[:, :-1].gather(2, labels[:, 1:].clamp(min=0).unsqueeze(2)).squeeze(2)
    faithful, _ = compute_token_loss("pear", logits, labels, behaviour_logp=behaviour, behaviour="data")
    variant, _ = compute_token_loss("pear", logits, labels, ref)
    assert faithful.item() == pytest.approx(variant.item(), rel=1e-6)  # the same π_β given two ways
    with pytest.raises(ValueError, match="tokens column behaviour_logp"):
        compute_token_loss("pear", logits, labels, behaviour="data")
    assert type(build_loss(PEARMethod(behaviour="data"))) is PEARBehaviourLoss
    assert type(build_loss(PEARMethod())) is PEARLoss and PEARLoss.needs_reference
    batch = collate([TokenisedRow("a", (1, 2, 3), (IGNORE_INDEX, 2, 3), (math.nan, -0.1, 0.0)),
                     TokenisedRow("b", (1, 2), (IGNORE_INDEX, 2), (math.nan, -0.2))], pad_token_id=0)
    assert batch["behaviour_logp"][1, 1] == pytest.approx(-0.2) and math.isnan(batch["behaviour_logp"][1, 2])


def test_the_presets_and_the_plan_refuse_pear_on_data_without_the_column():
    pear = compose(["experiment=forking", "profile=toy", "sft/method=pear"])
    base_ref = compose(["experiment=forking", "profile=toy", "sft/method=pear_base_ref"])
    assert method_label(pear.sft.method) == "pear_behaviourdata" and method_label(base_ref.sft.method) == "pear"
    check_behaviour_logprobs(pear, "pear")  # the forking world writes the column
    arithmetic = compose(["experiment=demo", "profile=toy", "toy.world=arithmetic", "sft/method=pear"])
    with pytest.raises(ConfigError, match=r"^sft/method=pear reads the SFT rows' column behaviour_logprobs .* "
                                          r"toy.world=arithmetic does not have.*sft/method=pear_base_ref"):
        check_behaviour_logprobs(arithmetic, "pear")
    check_behaviour_logprobs(compose(["experiment=demo", "profile=toy", "toy.world=arithmetic",
                                      "sft/method=pear_base_ref"]), "pear_base_ref")


def test_the_sft_stage_refuses_tokens_without_the_behaviour_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sft.data import SFTDataError, read_sft_tokens

    path = tmp_path / "sft_tokens.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2, 3]], "labels": [[IGNORE_INDEX, 2, 3]], "row_id": [0],
                             "num_response_tokens": [2], "truncated": [False]}), path)
    assert read_sft_tokens(path)[0].behaviour_logp is None
    with pytest.raises(SFTDataError, match=r"no column behaviour_logp, which the loss reads .*force=\[data\]"):
        read_sft_tokens(path, require_behaviour=True)
