"""The chunked loss head against the dense reference, plus the per-token terms' closed forms (docs/methods.md,
docs/sft.md)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from common.config.sft import (
    SFT_METHOD_SCHEMAS,
    DFTMethod,
    EKSFTMethod,
    GEMMethod,
    HighEntropyMethod,
    IWSFTMethod,
    ProFitMethod,
    SFTMethod,
)
from sft import token_stats
from sft.losses import DFTLoss, SFTLoss, build_loss
from sft.token_stats import TokenWeights, chunked_loss, dense_loss, prediction_rows, row_terms

# 3 sequences with prompt masks, right padding and one sequence with a single supervised token
LABELS = torch.tensor([
    [-100, -100, 4, 7, 1, 9, 2, 3],
    [-100, 5, 6, 0, 8, -100, -100, -100],
    [-100, -100, -100, -100, -100, 10, -100, -100],
])
VOCAB, HIDDEN = 13, 6

METHOD_CONFIGS = [schema() for schema in SFT_METHOD_SCHEMAS.values()] + [
    EKSFTMethod(compat="official_code", stats_dtype="fp32"),
    EKSFTMethod(selection="random", random_mask_ratio=0.3),
    EKSFTMethod(global_regularisation=True),
    EKSFTMethod(combine="intersection", rho=0.4),
    EKSFTMethod(selection_scope="sequence"),
    IWSFTMethod(level="token"),
    GEMMethod(h="logsigmoid"),
]


def _inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 8, HIDDEN, generator=generator)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator)
    ref_hidden = hidden + 0.5 * torch.randn(3, 8, HIDDEN, generator=generator)
    ref_weight = weight + 0.2 * torch.randn(VOCAB, HIDDEN, generator=generator)
    old_hidden = hidden + 0.2 * torch.randn(3, 8, HIDDEN, generator=generator)
    return hidden, weight, ref_hidden, ref_weight, old_hidden


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp(min=1e-12)).item()


@pytest.mark.parametrize("cfg", METHOD_CONFIGS, ids=[f"{c.name}-{i}" for i, c in enumerate(METHOD_CONFIGS)])
@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_chunked_matches_dense_loss_and_gradients(cfg, chunk_size):
    hidden, weight, ref_hidden, ref_weight, old_hidden = _inputs()
    loss = build_loss(cfg)
    h_chunked, w_chunked = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    chunked = chunked_loss(loss, h_chunked, w_chunked, LABELS, chunk_size=chunk_size, ref_hidden=ref_hidden,
                           ref_head_weight=ref_weight, old_hidden=old_hidden, old_head_weight=ref_weight)
    chunked.loss.backward()
    h_dense, w_dense = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    dense = dense_loss(loss, h_dense @ w_dense.T, LABELS, ref_logits=ref_hidden @ ref_weight.T,
                       old_logits=old_hidden @ ref_weight.T)
    dense.loss.backward()
    assert abs(chunked.loss.item() - dense.loss.item()) <= 1e-5 * abs(dense.loss.item()) + 1e-7
    assert _relative_error(h_chunked.grad, h_dense.grad) <= 1e-5
    assert _relative_error(w_chunked.grad, w_dense.grad) <= 1e-5
    assert chunked.num_tokens.item() == 11  # 6 + 4 + 1 supervised predictions
    assert set(chunked.metrics) == set(dense.metrics)
    for name, value in chunked.metrics.items():
        assert not value.requires_grad, name
        torch.testing.assert_close(value, dense.metrics[name], rtol=1e-5, atol=1e-6)


def test_rows_without_a_target_get_exactly_zero_hidden_gradient():
    hidden, weight, ref_hidden, ref_weight, _ = _inputs(1)
    old_hidden = hidden  # ratio 1: no PSFT row is clipped, so every supervised row has a gradient
    has_target = torch.zeros_like(LABELS, dtype=torch.bool)
    has_target[:, :-1] = LABELS[:, 1:] != -100
    every_row = {HighEntropyMethod: HighEntropyMethod(rho=1.0), ProFitMethod: ProFitMethod(threshold=0.0)}
    for name, schema in SFT_METHOD_SCHEMAS.items():
        h = hidden.clone().requires_grad_()
        method = every_row.get(schema) or schema()  # ρ < 1, τ > 0 leave rows out
        result = chunked_loss(build_loss(method), h, weight, LABELS, chunk_size=4, ref_hidden=ref_hidden,
                              ref_head_weight=ref_weight, old_hidden=old_hidden, old_head_weight=weight)
        result.loss.backward()
        assert (h.grad[~has_target] == 0).all(), name
        assert (h.grad[has_target].abs().sum(-1) > 0).all(), name


def test_backward_scales_with_the_upstream_gradient_and_tied_weights_accumulate():
    hidden, weight, *_ = _inputs(2)
    grads = []
    for scale in (1.0, 3.0):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        result = chunked_loss(build_loss(SFTMethod()), h, w, LABELS, chunk_size=3)
        (scale * result.loss + w.sum()).backward()  # w.sum(): a second use of the weight, as an embedding would
        grads.append((h.grad, w.grad - 1.0))
    torch.testing.assert_close(grads[1][0], 3.0 * grads[0][0])
    torch.testing.assert_close(grads[1][1], 3.0 * grads[0][1])


def test_no_supervised_token_gives_zero_loss_and_zero_gradients():
    hidden, weight, ref_hidden, ref_weight, _ = _inputs(3)
    labels = torch.full((3, 8), -100)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    result = chunked_loss(build_loss(EKSFTMethod()), h, w, labels, chunk_size=4, ref_hidden=ref_hidden,
                          ref_head_weight=ref_weight)
    result.loss.backward()
    assert result.loss.item() == 0.0 and result.num_tokens.item() == 0
    assert (h.grad == 0).all() and (w.grad == 0).all()


def test_no_grad_call_returns_the_value():
    hidden, weight, *_ = _inputs(4)
    with torch.no_grad():
        value = chunked_loss(build_loss(SFTMethod()), hidden, weight, LABELS, chunk_size=4).loss
    dense = dense_loss(build_loss(SFTMethod()), hidden @ weight.T, LABELS).loss
    assert value.item() == pytest.approx(dense.item(), rel=1e-6)


def test_bf16_inputs_give_grads_in_their_dtypes():
    hidden, weight, ref_hidden, ref_weight, _ = _inputs(5)
    h = hidden.bfloat16().requires_grad_()
    w = weight.bfloat16().requires_grad_()
    result = chunked_loss(build_loss(EKSFTMethod(compat="official_code")), h, w, LABELS, chunk_size=4,
                          ref_hidden=ref_hidden.bfloat16(), ref_head_weight=ref_weight.bfloat16())
    result.loss.backward()
    assert h.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    dense = dense_loss(build_loss(EKSFTMethod(compat="official_code")), (h @ w.T).detach(), LABELS,
                       ref_logits=ref_hidden.bfloat16() @ ref_weight.bfloat16().T).loss
    assert result.loss.item() == pytest.approx(dense.item(), rel=1e-2)


def test_input_errors_name_the_argument():
    hidden, weight, *_ = _inputs(6)
    eksft = build_loss(EKSFTMethod())
    with pytest.raises(ValueError, match="ref_hidden"):
        chunked_loss(eksft, hidden, weight, LABELS, chunk_size=4)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_loss(build_loss(SFTMethod()), hidden, weight, LABELS, chunk_size=0)
    with pytest.raises(ValueError, match="head_weight"):
        chunked_loss(build_loss(SFTMethod()), hidden, weight.T, LABELS, chunk_size=4)
    with pytest.raises(ValueError, match="labels"):
        chunked_loss(build_loss(SFTMethod()), hidden, weight, LABELS[:, :5], chunk_size=4)


def test_prediction_rows_shift_and_label_positions():
    labels = torch.tensor([[-100, -100, 7, 8], [-100, 5, -100, -100]])
    rows = prediction_rows(labels)
    assert rows.index.tolist() == [1, 2, 4]  # (0,1)→7, (0,2)→8, (1,0)→5
    assert rows.targets.tolist() == [7, 8, 5]
    official = prediction_rows(labels, include_label_positions=True)
    assert official.index.tolist() == [1, 2, 3, 4, 5]  # adds (0,3) and (1,1): labelled, nothing to predict
    assert official.has_target.tolist() == [True, True, False, True, False]
    assert official.is_label_position.tolist() == [False, True, True, False, True]
    assert official.sequence.tolist() == [0, 0, 0, 1, 1]


def test_row_terms_closed_form_gradients():
    # ∂H/∂z = −p(log p + H); ∂KL/∂z = p(log p − log q − KL); ∂(−log p_y)/∂z = p − e_y
    torch.manual_seed(7)
    logits = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(4, 9, dtype=torch.float64)
    targets = torch.tensor([0, 3, 8, 5])
    terms = row_terms(logits, targets, ["logp", "entropy", "kl", "forward_kl"], ref_logits=ref)
    logp, logq = logits.detach().log_softmax(-1), ref.log_softmax(-1)
    p, q = logp.exp(), logq.exp()
    entropy = -(p * logp).sum(-1)
    kl = (p * (logp - logq)).sum(-1)
    torch.testing.assert_close(terms["entropy"].detach(), entropy)
    torch.testing.assert_close(terms["kl"].detach(), kl)
    torch.testing.assert_close(terms["forward_kl"].detach(), (q * (logq - logp)).sum(-1))
    expected = {
        "logp": torch.nn.functional.one_hot(targets, 9).double() - p,
        "entropy": -p * (logp + entropy.unsqueeze(1)),
        "kl": p * (logp - logq - kl.unsqueeze(1)),
        "forward_kl": p - q,
    }
    for name, grad in expected.items():
        (actual,) = torch.autograd.grad(terms[name].sum(), logits, retain_graph=True)
        torch.testing.assert_close(actual, grad, msg=name)


def test_row_terms_kl_and_its_gradient_exactly_zero_for_equal_logits():
    logits = torch.randn(5, 11, requires_grad=True)
    kl = row_terms(logits, torch.zeros(5, dtype=torch.long), ["kl"], ref_logits=logits.detach().clone())["kl"]
    (grad,) = torch.autograd.grad(kl.sum(), logits)
    assert (kl == 0).all() and (grad == 0).all()


def test_chunked_kl_vanishes_when_reference_equals_policy():
    # pass A ranks on bitwise-equal chunk logits: KL = 0 exactly, so M_KL = ∅. Pass B builds reference logits for
    # the masked rows only, a matmul of another shape, so the KL gradient there is 0 up to matmul round-off.
    hidden, weight, *_ = _inputs(8)
    grads = []
    for lambda_kl in (0.0, 1.0):
        h = hidden.clone().requires_grad_()
        result = chunked_loss(build_loss(EKSFTMethod(lambda_kl=lambda_kl, rho=0.3)), h, weight, LABELS, chunk_size=4,
                              ref_hidden=hidden, ref_head_weight=weight)
        result.loss.backward()
        assert result.metrics["kl_reg"].item() == 0.0 and result.metrics["num_M_KL"].item() == 0
        assert result.metrics["num_M"].item() > 0
        grads.append(h.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_autocast_runs_the_head_in_the_autocast_dtype_with_fp32_weight_grads():
    hidden, weight, ref_hidden, ref_weight, _ = _inputs(9)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        result = chunked_loss(build_loss(EKSFTMethod()), h, w, LABELS, chunk_size=4, ref_hidden=ref_hidden,
                              ref_head_weight=ref_weight)
    result.loss.backward()
    assert w.grad.dtype == torch.float32 and h.grad.dtype == torch.float32
    reference = chunked_loss(build_loss(EKSFTMethod()), hidden, weight, LABELS, chunk_size=4, ref_hidden=ref_hidden,
                             ref_head_weight=ref_weight).loss
    assert result.loss.item() == pytest.approx(reference.item(), rel=2e-2)
    assert result.loss.item() != reference.item()  # the matmuls really ran in bf16


def test_row_terms_small_kls_keep_their_precision_at_a_large_vocabulary():
    # Σp log p − Σp log q over 65k terms cancels to KL ~5e-5: fp32 keeps ~1e-1 of it that way, 6e-5 here
    generator = torch.Generator().manual_seed(10)
    logits = 5.0 * torch.randn(8, 65_536, generator=generator, dtype=torch.float64)
    ref = logits + 0.01 * torch.randn(8, 65_536, generator=generator, dtype=torch.float64)
    targets = torch.zeros(8, dtype=torch.long)
    exact = row_terms(logits, targets, ["kl", "forward_kl"], ref_logits=ref)
    fp32 = row_terms(logits.float(), targets, ["kl", "forward_kl"], ref_logits=ref.float())
    for name in ("kl", "forward_kl"):
        torch.testing.assert_close(fp32[name].double(), exact[name], rtol=2e-4, atol=0.0, msg=name)


class _SFTWithPassA(SFTLoss):
    """Plain SFT as it was before it skipped pass A: ``log p_y`` from pass A, ``ce`` computed in ``weigh``."""

    stats = ("logp",)

    def weigh(self, stats):
        weights = super().weigh(stats)
        weights.metrics = super().head_metrics(stats)
        return weights


class _DFTWithPassA(DFTLoss):
    """DFT as it was before it skipped pass A: coefficient ``−sg(p_y)/|T|`` on ``log p_y`` from pass A."""

    stats = ("logp",)

    def weigh(self, stats):
        share = stats.has_target.float() / stats.has_target.sum().float().clamp(min=1.0)
        return TokenWeights(coefs={"logp": -share * stats.values["logp"].exp()}, constant=share.new_zeros(()),
                            metrics=super().head_metrics(stats))


@pytest.mark.parametrize("new_cfg, old_loss", [(SFTMethod(), _SFTWithPassA(SFTMethod())),
                                               (DFTMethod(), _DFTWithPassA(DFTMethod()))], ids=["sft", "dft"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sft_and_dft_skip_pass_a_with_bitwise_unchanged_loss_gradients_and_metrics(monkeypatch, new_cfg, old_loss,
                                                                                     dtype):
    hidden, weight, *_ = _inputs(7)
    head_matmuls = []
    real_head_logits = token_stats._head_logits
    monkeypatch.setattr(token_stats, "_head_logits", lambda *a: head_matmuls.append(1) or real_head_logits(*a))
    results = []
    for loss in (build_loss(new_cfg), old_loss):
        head_matmuls.clear()
        h, w = hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
        result = chunked_loss(loss, h, w, LABELS, chunk_size=4)
        result.loss.backward()
        results.append((result, h.grad, w.grad, len(head_matmuls)))
    (new, new_h, new_w, new_matmuls), (old, old_h, old_w, old_matmuls) = results
    assert new_matmuls == 0 and old_matmuls == 3  # 11 rows in chunks of 4: pass A ran 3 head matmuls before
    assert torch.equal(new.loss, old.loss) and torch.equal(new_h, old_h) and torch.equal(new_w, old_w)
    assert new.metrics.keys() == old.metrics.keys()
    for name, value in new.metrics.items():
        assert torch.equal(value, old.metrics[name]), name


def test_eksft_still_runs_pass_a(monkeypatch):
    hidden, weight, ref_hidden, ref_weight, _ = _inputs(8)
    head_matmuls = []
    real_head_logits = token_stats._head_logits
    monkeypatch.setattr(token_stats, "_head_logits", lambda *a: head_matmuls.append(1) or real_head_logits(*a))
    chunked_loss(build_loss(EKSFTMethod()), hidden, weight, LABELS, chunk_size=4, ref_hidden=ref_hidden,
                 ref_head_weight=ref_weight)
    assert len(head_matmuls) >= 6  # policy and reference logits of each of the 3 chunks in pass A


def _head_product_flops(run) -> int:
    """FLOPs of the matrix products ``run()`` does (``mm``, and the fp32 head-weight gradient's in-place ``addmm_``,
    which the counter does not count by itself): the head's, not ``_rowdot``'s ``bmm``."""
    aten = torch.ops.aten
    in_place = {aten.addmm_: lambda sum_shape, a_shape, b_shape, **_: 2 * a_shape[0] * a_shape[1] * b_shape[1]}
    with FlopCounterMode(display=False, custom_mapping=in_place) as counter:
        run()
    counts = counter.get_flop_counts()["Global"]
    return sum(counts.get(op, 0) for op in (aten.mm, aten.addmm, aten.addmm_))


@pytest.mark.parametrize("kept", [2, 3, 50])
def test_kept_logits_chunks_spare_pass_b_the_products_pass_a_made(kept):
    """``kept_logits_chunks``: pass B takes pass A's policy and reference logits of the first chunks instead of
    multiplying the head again. With every chunk kept the forward's head products are pass A's two (policy and
    reference, ``2·N·d·V`` each) and the two gradient products, ``8·N·d·V``; keeping the first chunk only (the
    default) multiplies the other chunks' policy rows and masked reference rows again. The loss and both gradients
    stay within fp32 round-off (a reference product of only the masked rows may round differently)."""
    hidden, weight, ref_hidden, ref_weight, _ = _inputs(3)
    loss = build_loss(EKSFTMethod(rho=0.3))
    rows, chunks = 11, 3  # LABELS' prediction rows in chunks of 4
    results, flops = {}, {}
    for chunks_kept in (1, kept):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()

        def run():
            results[chunks_kept] = chunked_loss(loss, h, w, LABELS, chunk_size=4, ref_hidden=ref_hidden,
                                                ref_head_weight=ref_weight, kept_logits_chunks=chunks_kept)
        flops[chunks_kept] = _head_product_flops(run)
        results[chunks_kept].loss.backward()
        results[chunks_kept] = (results[chunks_kept].loss.detach(), h.grad, w.grad)
    product = 2 * HIDDEN * VOCAB  # FLOPs of one row's head product
    recomputed = (flops[1] - flops[kept]) // product
    if kept >= chunks:
        assert flops[kept] == 4 * rows * product  # 8·N·d·V
    assert recomputed >= (min(kept, chunks) - 1) * 4  # at least the kept chunks' policy rows, 4 each
    for mine, theirs in zip(results[kept], results[1]):
        assert _relative_error(mine, theirs) < 1e-6


def test_kept_logits_chunks_must_be_a_positive_int():
    hidden, weight, ref_hidden, ref_weight, _ = _inputs()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="kept_logits_chunks"):
            chunked_loss(build_loss(EKSFTMethod()), hidden, weight, LABELS, chunk_size=4, ref_hidden=ref_hidden,
                         ref_head_weight=ref_weight, kept_logits_chunks=bad)


def test_prob_logp_term_value_and_closed_form_gradient():
    logits = torch.tensor([[1.0, 2.0, -1.0], [0.5, 0.0, 0.3]], requires_grad=True)
    targets = torch.tensor([1, 2])
    term = row_terms(logits, targets, ["prob_logp"])["prob_logp"]
    probs = torch.softmax(logits.detach(), -1)
    p_y = probs[torch.arange(2), targets]
    torch.testing.assert_close(term, p_y * p_y.log())
    term.sum().backward()
    one_hot = torch.nn.functional.one_hot(targets, 3).float()
    torch.testing.assert_close(logits.grad, p_y.unsqueeze(1) * (one_hot - probs))


@pytest.mark.parametrize("method", [SFTMethod(), EKSFTMethod()], ids=lambda m: m.name)
def test_bf16_head_weight_gradient_over_80_chunks_is_as_accurate_as_one_bf16_gemm(method):
    """FSDP2 mixed precision hands the head a bf16 weight: its gradient, summed over 80 chunks, stays within the error
    of plain bf16 autograd's single GEMM (both against fp64, one selection); a bf16 running sum was 4-5x worse."""
    from bench.head_grad_accuracy import head_grad_errors, random_head

    loss = build_loss(method)
    inputs = random_head(vocab=512, hidden_size=64, rows=320, device="cpu", reference=loss.needs_reference)
    errors = head_grad_errors(loss, inputs["hidden"], inputs["weight"], inputs["labels"], 4, inputs["ref_hidden"],
                              inputs["ref_weight"])
    assert errors["plain"] < 5e-3
    assert errors["chunked"] <= 1.5 * errors["plain"], errors


def test_plain_bf16_autograd_by_row_blocks_is_plain_bf16_autograd():
    """bench.head_grad_accuracy forms plain autograd's bf16 logit gradients a block of rows at a time, then one GEMM:
    the dense autograd gradient up to the GEMM's summation order."""
    from bench.head_grad_accuracy import FixedSelection, plain_weight_grad, random_head, weight_grad

    loss = FixedSelection(build_loss(EKSFTMethod()))
    inputs = random_head(vocab=128, hidden_size=32, rows=40, device="cpu", reference=True)
    args = (inputs["hidden"], inputs["weight"], inputs["labels"])
    dense = weight_grad(loss, *args, 8, inputs["ref_hidden"], inputs["ref_weight"], dense=True)
    blocked = plain_weight_grad(loss, *args, inputs["ref_hidden"], inputs["ref_weight"], block=8)
    assert blocked.dtype == dense.dtype == torch.bfloat16
    torch.testing.assert_close(blocked.float(), dense.float(), rtol=1e-2, atol=1e-4)


def test_token_stats_survive_the_float64_rows_of_the_step_gather_and_concatenate_in_order():
    hidden, weight, ref_hidden, ref_weight, _ = _inputs(3)
    loss = build_loss(EKSFTMethod(compat="official_code", stats_dtype="fp32"))  # label positions: both row masks
    stats = token_stats.chunked_statistics(loss, hidden, weight, LABELS, chunk_size=4, ref_hidden=ref_hidden,
                                           ref_head_weight=ref_weight)
    back = token_stats.TokenStats.from_rows(stats.to_rows(), list(stats.values), stats.num_sequences, VOCAB)
    for name in ("targets", "has_target", "is_label_position", "sequence"):
        assert torch.equal(getattr(back, name), getattr(stats, name)), name
    assert all(torch.equal(back.values[name], stats.values[name]) for name in stats.values)
    both = token_stats.TokenStats.concat([stats, back])
    assert both.num_rows == 2 * stats.num_rows and both.num_sequences == 6
    assert both.sequence.tolist() == stats.sequence.tolist() + [s + 3 for s in stats.sequence.tolist()]
    weights = TokenWeights(coefs={"logp": torch.arange(both.num_rows, dtype=torch.float32)},
                           constant=torch.tensor(2.0), metrics={"m": torch.tensor(1.0)})
    first, second = weights.split([stats.num_rows, stats.num_rows])
    assert torch.equal(torch.cat([first.coefs["logp"], second.coefs["logp"]]), weights.coefs["logp"])
    assert (first.constant.item(), second.constant.item()) == (2.0, 0.0) and second.metrics == weights.metrics


ONLINE_NAMES = ("logp", "entropy", "kl", "ref_logp")


def _online_case(seed: int, vocab: int, ref_scale: float, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    logits = 5.0 * torch.randn(6, vocab, generator=generator, dtype=dtype)
    ref = logits + ref_scale * torch.randn(6, vocab, generator=generator, dtype=dtype)
    return logits, ref, torch.randint(0, vocab, (6,), generator=generator)


@pytest.mark.parametrize("block", [7, 64, 1000])
@pytest.mark.parametrize("ref_scale", [1e-3, 0.5, 30.0], ids=["close", "far", "overflow"])
def test_online_statistics_equal_row_terms_in_fp64_over_any_blocks(monkeypatch, block, ref_scale):
    """The online recurrence is the same mathematics as ``row_terms``: blocks that do not divide the vocabulary, a
    reference 1e-3 away (KL ~1e-6), and one whose centred gap passes 80 nats (the plain KL, as ``_accurate_kl``)."""
    monkeypatch.setattr(token_stats, "ONLINE_BLOCK", block)
    logits, ref, targets = _online_case(1, 300, ref_scale)
    expected = row_terms(logits, targets, ONLINE_NAMES, ref_logits=ref)
    online = token_stats.online_chunk_statistics(logits, targets, ONLINE_NAMES, torch.float64, ref_logits=ref)
    assert list(online) == list(ONLINE_NAMES)
    for name in ONLINE_NAMES:
        torch.testing.assert_close(online[name], expected[name], rtol=1e-10, atol=1e-12, msg=name)


def test_online_statistics_in_fp32_are_as_accurate_as_row_terms_and_the_entropy_more():
    """Against fp64: ``log p_y``, ``log q_y`` and the KL as close as ``row_terms``' (within 1e-6 of its error); the
    entropy ``log s − a/s`` far closer than ``lse − Σ p z``, which cancels two numbers of order ``lse``."""
    logits, ref, targets = _online_case(2, 65_536, 0.01)
    exact = row_terms(logits, targets, ONLINE_NAMES, ref_logits=ref)
    eager = row_terms(logits.float(), targets, ONLINE_NAMES, ref_logits=ref.float())
    online = token_stats.online_chunk_statistics(logits.float(), targets, ONLINE_NAMES, torch.float32,
                                                 ref_logits=ref.float())
    error = {name: {label: (values[name].double() - exact[name]).abs().max().item()
                    for label, values in (("eager", eager), ("online", online))} for name in ONLINE_NAMES}
    for name in ("logp", "ref_logp", "kl"):
        assert error[name]["online"] <= error[name]["eager"] + 1e-6, (name, error[name])
    assert error["entropy"]["online"] < error["entropy"]["eager"] / 10, error["entropy"]


def test_online_kl_is_exactly_zero_for_equal_logits():
    logits, _, targets = _online_case(3, 300, 0.0, dtype=torch.float32)
    online = token_stats.online_chunk_statistics(logits, targets, ("kl",), torch.float32, ref_logits=logits.clone())
    assert torch.equal(online["kl"], torch.zeros(6))


@pytest.mark.parametrize("cfg", [EKSFTMethod(), EKSFTMethod(compat="official_code", stats_dtype="fp32"),
                                 SFT_METHOD_SCHEMAS["psft"]()], ids=["eksft", "eksft-official", "psft"])
def test_online_statistics_leave_the_loss_and_gradients_to_round_off_and_psfts_bitwise(cfg):
    """EKSFT through the online pass (and pass B reusing its entropy and KL): loss and both gradients within fp32
    round-off of ``row_terms``. The official code's ``code_kl`` keeps ``row_terms`` in pass A, its entropy is reused;
    PSFT (``logp``, ``old_logp``) keeps ``row_terms`` and reuses nothing: the same numbers bit for bit."""
    hidden, weight, ref_hidden, ref_weight, old_hidden = _inputs()
    loss = build_loss(cfg)
    frozen = ({"ref_hidden": ref_hidden, "ref_head_weight": ref_weight} if loss.needs_reference else
              {"old_hidden": old_hidden, "old_head_weight": weight} if loss.needs_old_policy else {})
    results = []
    for online in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        result = chunked_loss(loss, h, w, LABELS, chunk_size=5, online_statistics=online, **frozen)
        result.loss.backward()
        results.append((result.loss.detach(), h.grad, w.grad))
    for row_terms_value, online_value in zip(*results):
        if cfg.name == "psft":
            assert torch.equal(online_value, row_terms_value)
        else:
            assert _relative_error(online_value, row_terms_value) < 1e-6


@pytest.mark.parametrize("scope", ["micro_batch", "optimizer_batch"])
def test_pass_b_takes_eksfts_entropy_and_kl_from_pass_a_and_sums_no_row(monkeypatch, scope):
    """EKSFT's regulariser values and the constants of their closed-form gradients (``H`` in ``−p(log p + H)``,
    ``KL`` in ``p(log p − log q − KL)``) are pass A's fp32 statistics (``REUSED_TERMS``), also when a selection over
    the optimiser step hands them over with the weights: pass B does no row sum over the vocabulary (with the online
    pass, pass A does none either), and the loss and gradients equal those of pass B's own sums to round-off."""
    hidden, weight, ref_hidden, ref_weight, _ = _inputs()
    loss = build_loss(EKSFTMethod(selection_scope=scope))
    frozen = {"ref_hidden": ref_hidden, "ref_head_weight": ref_weight}
    sums = []
    rowdot = token_stats._rowdot
    monkeypatch.setattr(token_stats, "_rowdot", lambda a, b: sums.append(a.shape) or rowdot(a, b))

    def run():
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        weights = statistics = None
        if loss.selects_over_step:  # as sft.trainer.select_over_step hands them to the micro-batch's forward
            stats = token_stats.chunked_statistics(loss, h, w, LABELS, chunk_size=5, online_statistics=True, **frozen)
            weights, statistics = loss.weigh(stats), stats.values
        sums.clear()
        result = chunked_loss(loss, h, w, LABELS, chunk_size=5, weights=weights, statistics=statistics,
                              online_statistics=True, **frozen)
        result.loss.backward()
        return result.loss.detach(), h.grad, w.grad, len(sums)

    with monkeypatch.context() as before:
        before.setattr(token_stats, "REUSED_TERMS", ())
        *summed, summed_rows = run()
    *reused, reused_rows = run()
    assert summed_rows > 0 and reused_rows == 0
    for mine, theirs in zip(reused, summed):
        assert _relative_error(mine, theirs) < 1e-6
