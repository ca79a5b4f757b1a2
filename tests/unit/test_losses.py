"""Token losses through the dense reference API, against hand-computed values (formulas: docs/methods.md)."""
from __future__ import annotations

import math

import pytest
import torch

from common.config import CONF_DIR, ConfigError, compose
from common.config.sft import SFT_METHOD_SCHEMAS, EKSFTMethod, SFTConfig, SFTMethod
from sft.losses import (
    TOKEN_LOSSES,
    EKSFTLoss,
    EKSFTVariantsLoss,
    build_loss,
    compute_token_loss,
    register_token_loss,
    selection_size,
    top_rank_mask,
)
from sft.token_stats import TokenStats, chunked_loss, chunked_statistics, dense_loss, prediction_rows, row_terms

LN2 = math.log(2.0)


def _uniform(batch: int, length: int, vocab: int = 2) -> torch.Tensor:
    return torch.zeros(batch, length, vocab, requires_grad=True)


def _margin_logits(margins: list[float]) -> torch.Tensor:
    """[1, L, 2] logits [m, 0]: the smaller |m|, the higher the entropy."""
    return torch.tensor([[[m, 0.0] for m in margins]], requires_grad=True)


def _zero_grad_rows(logits: torch.Tensor) -> list[int]:
    return [i for i in range(logits.shape[1]) if bool((logits.grad[0, i] == 0).all())]


# ------------------------------------------------------------------------------------------ hand values


def test_uniform_two_token_vocab_values():
    labels = torch.tensor([[-100, 0, 1, 1]])  # 3 supervised predictions, p = 1/2 each
    ref = torch.zeros(1, 4, 2)
    assert compute_token_loss("sft", _uniform(1, 4), labels)[0].item() == pytest.approx(LN2)  # −log ½
    assert compute_token_loss("dft", _uniform(1, 4), labels)[0].item() == pytest.approx(LN2 / 2)  # −½ log ½
    assert compute_token_loss("iwsft", _uniform(1, 4), labels, ref)[0].item() == pytest.approx(LN2)  # w = 1
    assert compute_token_loss("psft", _uniform(1, 4), labels, old_logits=ref)[0].item() == pytest.approx(-1.0)  # −r
    assert compute_token_loss("asft", _uniform(1, 4), labels, ref)[0].item() == pytest.approx(LN2 / 2)  # KL = 0
    assert compute_token_loss("gem", _uniform(1, 4), labels)[0].item() == pytest.approx(0.0, abs=1e-7)  # Σq·0


def test_eksft_all_ties_paper_rank_masks_nothing_exact_k_masks_k():
    # 4 rows, all H = ln 2 and KL = 0, ρ = 0.5 ⇒ k = 2. Paper: every row has rank 4 > 2 ⇒ M = ∅ ⇒ plain CE = ln 2.
    labels = torch.tensor([[-100, 0, 1, 0, 1]])
    ref = torch.zeros(1, 5, 2)
    loss, metrics = compute_token_loss("eksft", _uniform(1, 5), labels, ref, rho=0.5)
    assert loss.item() == pytest.approx(LN2)
    assert metrics["num_M"].item() == 0 and metrics["num_M_KL"].item() == 0
    # exact_k: M_H = M_KL = rows {0, 1} ⇒ CE over 2 rows (ln 2) − 0.05 · mean_M H (ln 2) + 0.05 · 0.
    loss, metrics = compute_token_loss("eksft", _uniform(1, 5), labels, ref, rho=0.5, topk_ties="exact_k")
    assert loss.item() == pytest.approx(0.95 * LN2)
    assert metrics["num_M"].item() == 2 and metrics["iou"].item() == 1.0


def test_eksft_official_code_preset_hand_value():
    # labels [-100, 0, 1, 0, 1]: label positions U = {1,2,3,4}, k = ⌊0.5·4⌋ = 2, exact_k by index ⇒ M_H = M_KL = {1,2}.
    # CE loses rows 0 and 1 (one before each masked label) ⇒ CE over rows {2, 3} = ln 2.
    # entropy / ln V = 1 on M_H, ÷k ⇒ 1 ≥ target 0.5 ⇒ λ_H·0.95; code "KL" Σp(p − log q) = ½ + ln 2 < 2 ⇒ λ_KL·0.95.
    labels = torch.tensor([[-100, 0, 1, 0, 1]])
    loss, metrics = compute_token_loss("eksft", _uniform(1, 5), labels, torch.zeros(1, 5, 2), rho=0.5,
                                       compat="official_code")
    expected = LN2 - 0.95 * 0.05 * 1.0 + 0.95 * 0.05 * (0.5 + LN2)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["lambda_entropy"].item() == pytest.approx(0.0475)
    assert metrics["num_CE"].item() == 2


def test_official_preset_resolution_explicit_flag_wins():
    flags = EKSFTMethod(compat="official_code", kl_formula="true_kl").resolved()
    assert flags["kl_formula"] == "true_kl" and flags["k_rounding"] == "floor" and flags["dynamic_lambda"] is True
    assert EKSFTMethod().resolved()["mask_alignment"] == "paper"


def test_global_regularisation_is_full_ce_plus_both_regularisers_on_all_tokens():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, requires_grad=True)
    ref = torch.randn(2, 5, 7)
    labels = torch.tensor([[-100, 1, 2, 3, 4], [-100, -100, 5, 6, -100]])
    loss, _ = compute_token_loss("eksft", logits, labels, ref, global_regularisation=True,
                                 lambda_entropy=0.3, lambda_kl=0.7)
    logp = logits[:, :-1].log_softmax(-1)
    logq = ref[:, :-1].log_softmax(-1)
    mask = labels[:, 1:] != -100
    nll = -logp.gather(-1, labels[:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    expected = nll[mask].mean() - 0.3 * entropy[mask].mean() + 0.7 * kl[mask].mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def _small_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, reference logits, labels): B = 2, L = 6, V = 5, ``2 sin(0.7 n)`` and ``2 cos(1.3 n)`` of the flat
    index n; 8 supervised rows (and 8 label positions)."""
    n = torch.arange(2 * 6 * 5, dtype=torch.float32).reshape(2, 6, 5)
    labels = torch.tensor([[-100, 3, 1, 4, 0, 2], [-100, -100, 2, 2, 0, -100]])
    return (2.0 * torch.sin(0.7 * n)).requires_grad_(), 2.0 * torch.cos(1.3 * n), labels


# Computed by the code before EKSFT was split into EKSFTLoss (the paper) and EKSFTVariantsLoss (commit 24b9700, one
# EKSFTLoss.weigh for both arms), fp32 on CPU: loss, Σ|∂L/∂z|, |M|, |CE rows|, effective λ_H, λ_KL.
_BEFORE_THE_SPLIT = {"paper": (2.3421688079833984, 2.0840578079223633, 6, 2, 0.3, 0.2),
                     "official_code": (3.2579522132873535, 1.9606146812438965, 5, 3, 0.285, 0.21)}


@pytest.mark.parametrize("compat", ["paper", "official_code"])
def test_both_eksft_arms_keep_the_values_they_had_before_the_class_split(compat):
    # ρ = 0.4: paper k = ⌈0.4·8⌉ = 4 of the 8 rows; official k = ⌊0.4·8⌋ = 3 of the 8 label positions, and dynamic λ
    # (normalised entropy term 0.86 ≥ 0.5 ⇒ λ_H·0.95; code "KL" term 3.06 > 2 ⇒ λ_KL·1.05)
    logits, ref, labels = _small_batch()
    loss, metrics = compute_token_loss("eksft", logits, labels, ref, rho=0.4, lambda_entropy=0.3, lambda_kl=0.2,
                                       compat=compat)
    loss.backward()
    value, grad_l1, num_masked, num_ce, lambda_h, lambda_kl = _BEFORE_THE_SPLIT[compat]
    assert loss.item() == pytest.approx(value, rel=1e-6)
    assert logits.grad.abs().sum().item() == pytest.approx(grad_l1, rel=1e-6)
    assert (metrics["num_M"].item(), metrics["num_CE"].item()) == (num_masked, num_ce)
    assert metrics["lambda_entropy"].item() == pytest.approx(lambda_h) and \
        metrics["lambda_kl"].item() == pytest.approx(lambda_kl)
    if compat == "paper":  # Eq. 15 written out on the same batch
        z, zq, y = logits.detach()[:, :-1], ref[:, :-1], labels[:, 1:]
        rows = y != -100
        logp, logq = z.log_softmax(-1)[rows], zq.log_softmax(-1)[rows]
        nll = -logp.gather(-1, y[rows].unsqueeze(-1)).squeeze(-1)
        entropy, kl = -(logp.exp() * logp).sum(-1), (logp.exp() * (logp - logq)).sum(-1)
        by_entropy = set(torch.argsort(entropy, descending=True)[:4].tolist())
        masked = torch.tensor([i in by_entropy | set(torch.argsort(kl, descending=True)[:4].tolist())
                               for i in range(8)])
        expected = nll[~masked].mean() - 0.3 * entropy[masked].mean() + 0.2 * kl[masked].mean()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_each_eksft_preset_gets_its_class():
    paper = ("eksft", "eksft_no_entropy", "eksft_no_kl", "eksft_no_reg")
    other = ("eksft_official", "eksft_global_reg", "eksft_random_mask", "eksft_intersection")
    for preset in paper + other:
        loss = build_loss(compose([f"sft/method={preset}"]).sft.method)
        assert type(loss) is (EKSFTLoss if preset in paper else EKSFTVariantsLoss), preset
        assert loss.name == "eksft"
    # one flag off the paper's value is enough; the official preset with every flag set to the paper's is the paper
    assert type(build_loss(EKSFTMethod(kl_formula="official_code"))) is EKSFTVariantsLoss
    assert type(build_loss(EKSFTMethod(selection_scope="sequence"))) is EKSFTVariantsLoss
    paper_flags = dict(mask_alignment="paper", k_rounding="ceil", topk_ties="paper_rank", reg_sets="union",
                       entropy_norm="none", kl_formula="true_kl", dynamic_lambda=False, stats_dtype="fp32")
    assert type(build_loss(EKSFTMethod(compat="official_code", **paper_flags))) is EKSFTLoss


@pytest.mark.parametrize("rho", [0.0, 0.34, 1.0])
def test_official_class_under_the_paper_switches_is_the_paper_class_bitwise(rho):
    torch.manual_seed(9)
    base, ref = torch.randn(2, 7, 9), torch.randn(2, 7, 9)
    labels = torch.tensor([[-100, 1, 2, 3, -100, 5, 6], [-100, -100, 8, 0, 4, 4, -100]])
    method = EKSFTMethod(rho=rho, lambda_entropy=0.3, lambda_kl=0.7)
    results = []
    for loss_class in (EKSFTLoss, EKSFTVariantsLoss):
        logits = base.clone().requires_grad_()
        result = dense_loss(loss_class(method), logits, labels, ref_logits=ref)
        result.loss.backward()
        results.append((result.loss, logits.grad, result.metrics))
    (paper_loss, paper_grad, paper_metrics), (loss, grad, metrics) = results
    assert torch.equal(paper_loss, loss) and torch.equal(paper_grad, grad)
    assert paper_metrics.keys() == metrics.keys()
    assert all(torch.equal(paper_metrics[key], metrics[key]) for key in metrics)


# ------------------------------------------------------------------------------------------ gradients


def test_rho_zero_equals_sft_loss_and_gradient():
    torch.manual_seed(1)
    base = torch.randn(2, 6, 9)
    labels = torch.tensor([[-100, 1, 2, 3, 4, 5], [-100, -100, 6, 7, 8, -100]])
    sft_logits = base.clone().requires_grad_()
    eksft_logits = base.clone().requires_grad_()
    sft, _ = compute_token_loss("sft", sft_logits, labels)
    eksft, metrics = compute_token_loss("eksft", eksft_logits, labels, torch.randn(2, 6, 9), rho=0.0)
    sft.backward()
    eksft.backward()
    assert torch.equal(sft, eksft)
    assert torch.equal(sft_logits.grad, eksft_logits.grad)
    assert metrics["num_M"].item() == 0


def test_identical_reference_kl_term_and_gradient_exactly_zero_in_paper_mode():
    torch.manual_seed(2)
    base = torch.randn(1, 8, 11)
    labels = torch.randint(0, 11, (1, 8))
    grads, losses = [], []
    for lambda_kl in (0.0, 1.0):
        logits = base.clone().requires_grad_()
        loss, metrics = compute_token_loss("eksft", logits, labels, base.clone(), rho=0.3, lambda_kl=lambda_kl)
        loss.backward()
        grads.append(logits.grad)
        losses.append(loss)
        assert metrics["kl_reg"].item() == 0.0 and metrics["num_M_KL"].item() == 0  # step 0: M_KL = ∅
    assert torch.equal(losses[0], losses[1]) and torch.equal(grads[0], grads[1])
    # the official "KL" Σp(p − log q) is not zero at p = q and pushes the masked rows (D9)
    logits = base.clone().requires_grad_()
    loss, metrics = compute_token_loss("eksft", logits, labels, base.clone(), rho=0.3, lambda_kl=1.0,
                                       kl_formula="official_code")
    loss.backward()
    assert metrics["kl_reg"].item() > 0.1
    assert not torch.allclose(logits.grad, grads[0])


def test_masked_rows_get_the_label_free_gradient():
    # per-position logit gradient (§1.4): i ∉ M: a(p − e_y); i ∈ M: b·p(log p + H) + c·p(log p − log q − KL)
    torch.manual_seed(3)
    logits = torch.randn(1, 7, 5, requires_grad=True)
    ref = torch.randn(1, 7, 5)
    labels = torch.randint(0, 5, (1, 7))
    lambda_h, lambda_kl = 0.3, 0.2
    loss, metrics = compute_token_loss("eksft", logits, labels, ref, rho=0.34, lambda_entropy=lambda_h,
                                       lambda_kl=lambda_kl)
    loss.backward()
    z, zq, y = logits.detach()[0, :-1], ref[0, :-1], labels[0, 1:]
    logp, logq = z.log_softmax(-1), zq.log_softmax(-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    kl = (p * (logp - logq)).sum(-1)
    k = math.ceil(0.34 * 6)  # = 3 (values distinct, so rank = position in the sorted order)
    top_h = set(torch.argsort(entropy, descending=True)[:k].tolist())
    top_kl = set(torch.argsort(kl, descending=True)[:k].tolist())
    masked = top_h | top_kl
    assert metrics["num_M"].item() == len(masked) < 6
    a, b, c = 1 / (6 - len(masked)), lambda_h / len(masked), lambda_kl / len(masked)
    for i in range(6):
        if i in masked:
            expected = b * p[i] * (logp[i] + entropy[i]) + c * p[i] * (logp[i] - logq[i] - kl[i])
        else:
            expected = a * (p[i] - torch.nn.functional.one_hot(y[i], 5))
        torch.testing.assert_close(logits.grad[0, i], expected, rtol=1e-5, atol=1e-7)
    assert (logits.grad[0, -1] == 0).all()  # the last position predicts nothing


def test_psft_and_iwsft_equal_sft_gradient_when_policy_equals_reference():
    torch.manual_seed(4)
    base = torch.randn(2, 6, 9)
    labels = torch.tensor([[-100, 1, 2, 3, 4, 5], [-100, -100, 6, 7, 8, -100]])
    reference = base.clone().requires_grad_()
    compute_token_loss("sft", reference, labels)[0].backward()
    for name, kwargs in (("psft", {"old_logits": base.clone()}), ("iwsft", {"ref_logits": base.clone()}),
                         ("iwsft", {"ref_logits": base.clone(), "level": "token"})):
        params = {key: value for key, value in kwargs.items() if key == "level"}
        tensors = {key: value for key, value in kwargs.items() if key != "level"}
        logits = base.clone().requires_grad_()
        compute_token_loss(name, logits, labels, **tensors, **params)[0].backward()
        torch.testing.assert_close(logits.grad, reference.grad, rtol=1e-6, atol=1e-8)


def test_psft_clipped_tokens_have_no_gradient():
    # r = e^1 > 1.28 on every row ⇒ loss = −1.28, gradient 0
    labels = torch.tensor([[-100, 0, 1]])
    logits = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]], requires_grad=True)
    old = logits.detach().clone()
    old[0, 0, 0] -= 5.0
    old[0, 1, 1] -= 5.0
    loss, metrics = compute_token_loss("psft", logits, labels, old_logits=old)
    loss.backward()
    assert loss.item() == pytest.approx(-1.28)
    assert metrics["psft_clip_frac"].item() == 1.0
    assert (logits.grad == 0).all()


def test_iwsft_sequence_weight_is_clipped_geometric_mean_ratio():
    # one sequence, 2 rows: log p − log q = ln 2 and ln 8 ⇒ w = exp(mean) = exp(2 ln 2) = 4; loss = 4 · mean NLL
    labels = torch.tensor([[-100, 0, 0]])
    logits = torch.zeros(1, 3, 2, requires_grad=True)  # p = ½
    ref = torch.tensor([[[math.log(1 / 4), math.log(3 / 4)], [math.log(1 / 16), math.log(15 / 16)], [0.0, 0.0]]])
    loss, metrics = compute_token_loss("iwsft", logits, labels, ref)
    assert metrics["iw_weight_mean"].item() == pytest.approx(4.0, rel=1e-6)
    assert loss.item() == pytest.approx(4.0 * LN2, rel=1e-6)


def test_ignored_positions_get_exactly_zero_gradient():
    torch.manual_seed(5)
    labels = torch.tensor([[-100, -100, 3, 4, -100, -100], [-100, 1, 2, -100, -100, -100]])
    no_target = [(0, 0), (0, 3), (0, 4), (0, 5), (1, 2), (1, 3), (1, 4), (1, 5)]
    for name in SFT_METHOD_SCHEMAS:
        logits = torch.randn(2, 6, 7, requires_grad=True)
        extra = torch.randn(2, 6, 7)
        loss, _ = compute_token_loss(name, logits, labels, ref_logits=extra, old_logits=extra)
        loss.backward()
        for b, i in no_target:
            assert (logits.grad[b, i] == 0).all(), (name, b, i)


def test_empty_batch_gives_zero_loss_on_the_graph():
    logits = torch.randn(1, 4, 5, requires_grad=True)
    labels = torch.full((1, 4), -100)
    for name in SFT_METHOD_SCHEMAS:
        loss, metrics = compute_token_loss(name, logits, labels, ref_logits=logits.detach(),
                                           old_logits=logits.detach())
        assert loss.item() == 0.0 and metrics["num_tokens"].item() == 0
        (grad,) = torch.autograd.grad(loss, logits)
        assert (grad == 0).all()


# ------------------------------------------------------------------------------------------ selection


def test_selection_size_rounding():
    count = torch.tensor(30)
    assert selection_size(count, 0.1, "ceil").item() == 3  # 0.1·30 = 3.0000000000000004 in floats
    assert selection_size(torch.tensor(4), 0.2, "ceil").item() == 1
    assert selection_size(torch.tensor(4), 0.2, "floor").item() == 0
    assert selection_size(torch.tensor(0), 0.2, "ceil").item() == 0


@pytest.mark.parametrize("values,k,paper,exact", [
    ([3.0, 3.0, 2.0, 1.0], 1, [], [0]),            # tie at the boundary: both rows have rank 2 > 1
    ([3.0, 3.0, 2.0, 1.0], 2, [0, 1], [0, 1]),
    ([3.0, 2.0, 2.0, 1.0], 2, [0], [0, 1]),        # rows 1, 2 have rank 3
    ([0.0, 0.0, 0.0, 0.0], 1, [], [0]),            # step 0: all KL = 0 ⇒ M_KL = ∅ (paper)
    ([1.0, 5.0, 4.0, 9.0], 4, [0, 1, 2, 3], [0, 1, 2, 3]),
])
def test_top_rank_mask_ties(values, k, paper, exact):
    values = torch.tensor(values)
    candidates = torch.ones(4, dtype=torch.bool)
    for ties, expected in (("paper_rank", paper), ("exact_k", exact)):
        mask = top_rank_mask(values, candidates, torch.tensor(float(k)), ties)
        assert mask.nonzero().squeeze(1).tolist() == expected, ties


def test_top_rank_mask_ignores_non_candidates():
    values = torch.tensor([9.0, 1.0, 2.0, 3.0])
    candidates = torch.tensor([False, True, True, True])
    assert top_rank_mask(values, candidates, torch.tensor(1.0), "paper_rank").tolist() == [False, False, False, True]


def _union_intersection_case(combine: str) -> list[int]:
    # 1×6, V = 2: rows 0..4 supervised. Entropy order (small |margin| first): rows 0, 1. KL > 0 only on rows 1, 3
    # (row 3 largest) ⇒ with ρ = 0.4 (k = 2): M_H = {0, 1}, M_KL = {3, 1}. λ = 0 ⇒ masked rows get zero gradient.
    logits = _margin_logits([0.0, 0.5, 1.0, 2.0, 3.0, 4.0])
    ref = logits.detach().clone()
    ref[0, 1, 0] += 1.0
    ref[0, 3, 0] += 2.0
    labels = torch.tensor([[-100, 0, 0, 0, 0, 0]])
    loss, _ = compute_token_loss("eksft", logits, labels, ref, rho=0.4, lambda_entropy=0.0, lambda_kl=0.0,
                                 combine=combine)
    loss.backward()
    return [i for i in _zero_grad_rows(logits) if i != 5]


def test_union_and_intersection_select_the_expected_rows():
    assert _union_intersection_case("union") == [0, 1, 3]
    assert _union_intersection_case("intersection") == [1]


def test_mask_alignment_paper_shifted_vs_official_unshifted():
    # labels [-100, -100, y, y, y, y]: paper ranks rows P = {1..4}; official ranks label positions U = {2..5}.
    # Entropy order: row 5 > row 3 > row 4 > ... (row 5 not uniform: the entropy gradient vanishes there) With ρ = 0.25, k = 1 and KL ≡ 0 (ref = policy):
    # paper M = {3} ⇒ row 3 loses CE; official M = {5} ⇒ row 4 (= 5 − 1) loses CE.
    labels = torch.tensor([[-100, -100, 0, 0, 0, 0]])
    found = {}
    for alignment in ("paper", "official_code"):
        logits = _margin_logits([5.0, 4.0, 3.0, 1.0, 2.5, 0.2])
        loss, _ = compute_token_loss("eksft", logits, labels, logits.detach().clone(), rho=0.25, lambda_entropy=0.0,
                                     lambda_kl=0.0, mask_alignment=alignment)
        loss.backward()
        found[alignment] = _zero_grad_rows(logits)
    assert found["paper"] == [0, 3, 5]
    assert found["official_code"] == [0, 4, 5]
    # with λ_H > 0 the official alignment regularises row 5, which predicts nothing
    logits = _margin_logits([5.0, 4.0, 3.0, 1.0, 2.5, 0.2])
    compute_token_loss("eksft", logits, labels, logits.detach().clone(), rho=0.25,
                       mask_alignment="official_code")[0].backward()
    assert not (logits.grad[0, 5] == 0).all()


def test_selection_scope_sequence_ranks_each_sequence():
    # seq 0 rows have higher entropy than every row of seq 1; k = ⌈0.25·8⌉ = 2 over the micro-batch both picks
    # fall in seq 0; per sequence k = 1 each.
    labels = torch.tensor([[-100, 0, 0, 0, 0], [-100, 0, 0, 0, 0]])
    margins = [[0.0, 0.3, 0.6, 0.9, 9.0], [2.0, 2.5, 3.0, 1.5, 9.0]]
    found = {}
    for scope in ("micro_batch", "sequence"):
        logits = torch.tensor([[[m, 0.0] for m in row] for row in margins], requires_grad=True)
        loss, _ = compute_token_loss("eksft", logits, labels, logits.detach().clone(), rho=0.25, lambda_entropy=0.0,
                                     lambda_kl=0.0, selection_scope=scope)
        loss.backward()
        found[scope] = [(b, i) for b in range(2) for i in range(4) if (logits.grad[b, i] == 0).all()]
    assert found["micro_batch"] == [(0, 0), (0, 1)]
    assert found["sequence"] == [(0, 0), (1, 3)]


def test_random_mask_is_reproducible_and_sized():
    torch.manual_seed(6)
    labels = torch.randint(0, 9, (2, 16))
    logits = torch.randn(2, 16, 9)
    masks = []
    for seed in (0, 0, 1):
        lg = logits.clone().requires_grad_()
        loss, metrics = compute_token_loss("eksft", lg, labels, logits, selection="random", random_mask_ratio=0.1,
                                           random_mask_seed=seed, lambda_entropy=0.0, lambda_kl=0.0)
        loss.backward()
        assert metrics["num_M"].item() == math.ceil(0.1 * 30)
        masks.append((lg.grad[:, :-1].abs().sum(-1) == 0))
    assert torch.equal(masks[0], masks[1])
    assert not torch.equal(masks[0], masks[2])


# ------------------------------------------------------------------------------------------ registry


def test_registry_matches_schemas_and_presets():
    assert set(TOKEN_LOSSES) == set(SFT_METHOD_SCHEMAS)
    for name in TOKEN_LOSSES:
        assert (CONF_DIR / "sft" / "method" / f"{name}.yaml").is_file()
        assert build_loss(SFT_METHOD_SCHEMAS[name]()).name == name


def test_registering_an_existing_name_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_token_loss("sft")(type("Again", (TOKEN_LOSSES["sft"],), {}))


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ConfigError, match="valid: .*'eksft'"):
        build_loss(SFTMethod(name="nope"))
    with pytest.raises(ConfigError, match="valid: .*'dft'"):
        compute_token_loss("nope", torch.zeros(1, 2, 2), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ConfigError, match="rhoo"):
        compute_token_loss("eksft", torch.zeros(1, 2, 2), torch.zeros(1, 2, dtype=torch.long), rhoo=0.1)
    with pytest.raises(ConfigError, match="sft.method.rho"):
        compute_token_loss("eksft", torch.zeros(1, 2, 2), torch.zeros(1, 2, dtype=torch.long), rho=2.0)


def test_flags_declared_by_each_loss():
    assert build_loss(SFT_METHOD_SCHEMAS["eksft"]()).needs_reference
    psft = build_loss(SFT_METHOD_SCHEMAS["psft"](updates_per_refresh=5))
    assert psft.needs_old_policy and psft.old_policy_refresh_every == 5
    sft = build_loss(SFTMethod())
    assert not sft.needs_reference and not sft.needs_old_policy and sft.old_policy_refresh_every == 0


def test_missing_reference_is_named():
    with pytest.raises(ValueError, match="ref_logits"):
        compute_token_loss("eksft", torch.zeros(1, 3, 2), torch.zeros(1, 3, dtype=torch.long))


# ------------------------------------------------------------------------------------------ loss normalisation


def test_official_preset_brings_the_official_loss_normalisation():
    # D13: HF Trainer sums the GA micro-batch means (no ÷GA) ⇒ micro_batch_sum, winning over sft.loss_norm
    official = compose(["sft/method=eksft_official", "sft.loss_norm=global_token_mean"]).sft
    assert official.effective_loss_norm() == "micro_batch_sum"
    assert compose(["sft/method=eksft", "sft.loss_norm=global_token_mean"]).sft.effective_loss_norm() == \
        "global_token_mean"
    overridden = EKSFTMethod(compat="official_code", loss_norm="micro_batch_mean")
    assert SFTConfig(method=overridden).effective_loss_norm() == "micro_batch_mean"
    assert SFTConfig(method=SFTMethod(loss_norm="global_token_mean")).effective_loss_norm() == "global_token_mean"
    with pytest.raises(ConfigError, match="sft.method.loss_norm"):
        build_loss(SFTMethod(loss_norm="token_sum"))


# ------------------------------------------------------------------------------------------ stationary points

_Z_REF = torch.tensor([2.0, 1.0, 0.5, -0.5, -1.5])


def _entropy(probs: torch.Tensor) -> float:
    return float(-(probs * probs.clamp(min=1e-300).log()).sum())


def _regulariser_only(row: int, z_ref: torch.Tensor, **params) -> tuple[torch.Tensor, torch.Tensor]:
    """(policy logits, reference logits) [1, 2, V] where the loss of labels [[-100, 0]] is the regulariser of row
    ``row`` alone: ρ = 1 masks the only rankable row, so no CE term is left (paper: row 0; official alignment: the
    label position, row 1, whose masking drops row 0's CE)."""
    ref = torch.zeros(1, 2, z_ref.numel(), dtype=z_ref.dtype)
    ref[0, row] = z_ref
    _, metrics = compute_token_loss("eksft", ref.clone(), torch.tensor([[-100, 0]]), ref, rho=1.0, **params)
    assert metrics["num_M"].item() == 1 and metrics["ce"].item() == 0.0
    return ref.clone(), ref


def test_paper_regulariser_fixed_point_is_the_tempered_reference():
    # min_p −λ_H H(p) + λ_KL KL(p‖q) ⇒ p ∝ q^{λ_KL/(λ_H+λ_KL)} = softmax(z_ref · 0.7): gradient descent on the
    # logits of one masked row, through the registry's loss, from p = q
    params = dict(lambda_entropy=0.3, lambda_kl=0.7)
    logits, ref = _regulariser_only(0, _Z_REF, **params)
    labels = torch.tensor([[-100, 0]])
    for _ in range(200):
        logits.requires_grad_()
        (grad,) = torch.autograd.grad(compute_token_loss("eksft", logits, labels, ref, rho=1.0, **params)[0], logits)
        logits = (logits - 4.0 * grad).detach()
    probs = logits[0, 0].softmax(-1)
    torch.testing.assert_close(probs, (_Z_REF * 0.7).softmax(-1), atol=1e-5, rtol=0)
    assert _entropy(probs) > _entropy(_Z_REF.softmax(-1)) + 0.2  # it raises entropy (equal λ: temperature 2)


def _official_fixed_point(log_q: torch.Tensor, ratio: float) -> torch.Tensor:
    """Solution of the official regulariser's stationarity condition ``log p_v + 2r p_v = r log q_v + μ`` (the
    entropy ÷ ln V and Σp(p − log q) terms of one row in M_H ∩ M_KL, ``r = λ_KL ln V / λ_H``): Newton in
    ``u = log p_v`` per entry, bisection on μ for Σp = 1."""
    def probs(mu: float) -> torch.Tensor:
        target = ratio * log_q + mu
        u = torch.minimum(target, torch.zeros_like(target))
        for _ in range(60):
            slope = 2.0 * ratio * u.exp()
            u = u - (u + slope - target) / (1.0 + slope)
        return u.exp()

    low, high = -ratio * float(log_q.max()) - 60.0, -ratio * float(log_q.max()) + 60.0
    for _ in range(80):
        middle = (low + high) / 2
        low, high = (low, middle) if probs(middle).sum() > 1 else (middle, high)
    return probs((low + high) / 2)


def test_official_regulariser_fixed_point_sharpens_the_reference():
    # On a row in M_H and M_KL the official terms are −(λ_H/ln V) H(p) + λ_KL Σ p (p − log q): stationary where
    # p ∝ q^{r} e^{−2 r p}, r = λ_KL ln V / λ_H = ln V for equal λ, i.e. the reference at temperature ≈ 1/ln V.
    vocab = 1000
    z_ref = 3.0 * torch.randn(vocab, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    params = dict(lambda_entropy=0.05, lambda_kl=0.05, compat="official_code", dynamic_lambda=False)
    fixed = _official_fixed_point(z_ref.log_softmax(-1), math.log(vocab))
    labels = torch.tensor([[-100, 0]])
    grad_norms = []
    for z in (z_ref, fixed.log()):
        logits, ref = _regulariser_only(1, z_ref, **params)
        logits[0, 1] = z
        logits.requires_grad_()
        (grad,) = torch.autograd.grad(compute_token_loss("eksft", logits, labels, ref, rho=1.0, **params)[0], logits)
        grad_norms.append(float(grad.norm()))
    assert grad_norms[1] < 1e-4 * grad_norms[0]  # the registry's (fp32) gradient vanishes at the solved point
    assert _entropy(fixed) < _entropy(z_ref.softmax(-1)) - 2.0  # 4.17 → 1.85 nats: sharpening
    # the full preset (dynamic λ on) moves the same way under gradient descent from p = q
    full = dict(lambda_entropy=0.05, lambda_kl=0.05, compat="official_code")
    logits, ref = _regulariser_only(1, z_ref, **full)
    for _ in range(100):
        logits.requires_grad_()
        (grad,) = torch.autograd.grad(compute_token_loss("eksft", logits, labels, ref, rho=1.0, **full)[0], logits)
        logits = (logits - 20.0 * grad).detach()
    assert _entropy(logits[0, 1].softmax(-1)) < _entropy(z_ref.softmax(-1)) - 0.5


# ------------------------------------------------------------------------------------------ ablation fixes


def _random_mask(labels: torch.Tensor, logits: torch.Tensor, step: int, **params) -> torch.Tensor:
    lg = logits.clone().requires_grad_()
    loss, metrics = compute_token_loss("eksft", lg, labels, logits, step=step, selection="random",
                                       random_mask_ratio=0.25, lambda_entropy=0.0, lambda_kl=0.0, **params)
    loss.backward()
    return lg.grad[:, :-1].abs().sum(-1) == 0  # masked rows: no CE, λ = 0 ⇒ exactly zero gradient


def test_random_mask_is_redrawn_every_step_and_fixed_per_step_and_sequence():
    torch.manual_seed(7)
    labels = torch.randint(0, 9, (2, 17))
    logits = torch.randn(2, 17, 9)
    masks = [_random_mask(labels, logits, step) for step in (0, 0, 1, 2)]
    assert all(int(mask.sum()) == math.ceil(0.25 * 32) for mask in masks)
    assert torch.equal(masks[0], masks[1])
    assert not torch.equal(masks[0], masks[2]) and not torch.equal(masks[2], masks[3])
    # per sequence: sequence 0's mask at step 3 does not depend on the sequence beside it
    other = torch.cat([labels[:1], torch.randint(0, 9, (1, 17))])
    kwargs = dict(selection_scope="sequence")
    assert torch.equal(_random_mask(labels, logits, 3, **kwargs)[0], _random_mask(other, logits, 3, **kwargs)[0])


def _chunked_pair(dtype_context, **eksft_params) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(loss, hidden grad, weight grad) of sft and of eksft(**eksft_params) on the chunked head, same inputs."""
    torch.manual_seed(8)
    hidden, weight, ref_hidden = torch.randn(2, 9, 6), torch.randn(11, 6), torch.randn(2, 9, 6)
    labels = torch.tensor([[-100, 1, 2, 3, 4, 5, 6, 7, 8], [-100, -100, -100, 9, 10, 0, -100, -100, -100]])
    out = []
    for method in (SFTMethod(), EKSFTMethod(**eksft_params)):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with dtype_context():
            result = chunked_loss(build_loss(method), h, w, labels, chunk_size=4, ref_hidden=ref_hidden,
                                  ref_head_weight=weight)
        result.loss.backward()
        out.append([result.loss.detach(), h.grad, w.grad])
    return out[0], out[1]


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16_autocast"])
def test_rho_zero_equals_sft_bitwise_on_the_chunked_head(autocast):
    def context():
        return torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)

    sft, eksft = _chunked_pair(context, rho=0.0)
    for a, b in zip(sft, eksft):
        assert torch.equal(a, b)
    # per-sequence selection averages the sequences' CE means instead: not SFT's token mean (9 ≠ 3 rows)
    sft, per_sequence = _chunked_pair(context, rho=0.0, selection_scope="sequence")
    assert not torch.equal(sft[0], per_sequence[0])


# ------------------------------------------------------------------------------------------ newer baselines


def test_sedsft_hand_values_and_gradient():
    # V = 2, top_k = 1 (mass = max p), τ = 0.95; targets 0 with p = 0.5, 0.75, 0.99:
    # rows 0, 1 flexible (0.5, 0.75 < 0.95), row 2 rigid; (p − ½)² = 0, 1/16, –.
    labels = torch.tensor([[-100, 0, 0, 0]])
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [math.log(99.0), 0.0], [0.0, 0.0]]],
                          requires_grad=True)
    loss, metrics = compute_token_loss("sedsft", logits, labels, top_k=1, lambda_de=1.0, threshold=0.95)
    ce = -(math.log(0.5) + math.log(0.75) + math.log(0.99)) / 3
    assert loss.item() == pytest.approx(ce + (0.0 + 1 / 16) / 3, rel=1e-6)
    assert metrics["sed_flexible_frac"].item() == pytest.approx(2 / 3)
    loss.backward()
    # row 1: CE (p − e_y)/3 = [−.25, .25]/3; DE 2(p_y − ½) p_y (e_y − p)/3 = .375·[.25, −.25]/3
    torch.testing.assert_close(logits.grad[0, 1], torch.tensor([-0.15625, 0.15625]) / 3, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(logits.grad[0, 2], torch.tensor([-0.01, 0.01]) / 3, rtol=1e-5, atol=1e-7)


def test_eaft_weights_ce_by_normalised_top_k_entropy():
    # V = 2, k = 2: w = H/ln 2: p = (½, ½) ⇒ w = 1; p = (¾, ¼) ⇒ H = 0.562335 ⇒ w = 0.811278
    labels = torch.tensor([[-100, 0, 0]])
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [0.0, 0.0]]])
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    for alpha in (1.0, 2.0):
        loss, metrics = compute_token_loss("eaft", logits, labels, top_k=2, alpha=alpha)
        expected = (LN2 + (h / LN2) ** alpha * -math.log(0.75)) / 2
        assert loss.item() == pytest.approx(expected, rel=1e-6)
    # top-2 of V = 3: p = (½, ¼, ¼) ⇒ softmax of the two largest logits = (⅔, ⅓) ⇒ H = 0.636514 ⇒ w = 0.918296
    logits3 = torch.tensor([[[math.log(2.0), 0.0, 0.0], [0.0, 0.0, 0.0]]])
    loss, metrics = compute_token_loss("eaft", logits3, torch.tensor([[-100, 0]]), top_k=2)
    assert metrics["eaft_weight_mean"].item() == pytest.approx(0.918296, rel=1e-5)
    assert loss.item() == pytest.approx(0.918296 * LN2, rel=1e-5)


def test_highentropy_ce_only_on_the_top_rho_entropy_rows():
    # 5 rows, margins 0, .5, 1, 2, 3 ⇒ entropy falls with the row; ρ = 0.4 ⇒ k = 2 ⇒ rows 0, 1, mean CE there
    logits = _margin_logits([0.0, 0.5, 1.0, 2.0, 3.0, 0.0])
    loss, metrics = compute_token_loss("highentropy", logits, torch.tensor([[-100, 0, 0, 0, 0, 0]]), rho=0.4)
    expected = (LN2 - math.log(1 / (1 + math.exp(-0.5)))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["num_M_H"].item() == 2
    loss.backward()
    assert _zero_grad_rows(logits) == [2, 3, 4, 5]


# ------------------------------------------------------------------------------------------ ProFit, PEAR


def _two_token_logits(probs: list[list[float]]) -> torch.Tensor:
    """[B, L, 2] logits log(p, 1 − p): target 0 has probability p at each row."""
    return torch.tensor([[[math.log(p), math.log(1.0 - p)] for p in row] for row in probs])


def test_profit_ce_only_where_the_target_probability_reaches_tau():
    # p = ½, 0.05, ¾ with τ = 0.1: rows 0 and 2 kept; the sum divides by all 3 supervised rows (num_items_in_batch)
    logits = _two_token_logits([[0.5, 0.05, 0.75, 0.5]]).requires_grad_()
    loss, metrics = compute_token_loss("profit", logits, torch.tensor([[-100, 0, 0, 0]]), threshold=0.1)
    assert loss.item() == pytest.approx(-(math.log(0.5) + math.log(0.75)) / 3, rel=1e-6)
    assert metrics["profit_kept_frac"].item() == pytest.approx(2 / 3)
    assert metrics["ce"].item() == pytest.approx(-(math.log(0.5) + math.log(0.05) + math.log(0.75)) / 3, rel=1e-6)
    loss.backward()
    torch.testing.assert_close(logits.grad[0, 0], torch.tensor([-0.5, 0.5]) / 3)  # (p − e_y) / |T|
    torch.testing.assert_close(logits.grad[0, 2], torch.tensor([-0.25, 0.25]) / 3)
    assert (logits.grad[0, 1] == 0).all() and (logits.grad[0, 3] == 0).all()
    # τ = 0 keeps every token: SFT
    sft, _ = compute_token_loss("sft", logits.detach(), torch.tensor([[-100, 0, 0, 0]]))
    assert compute_token_loss("profit", logits.detach(), torch.tensor([[-100, 0, 0, 0]]), threshold=0.0)[0].item() \
        == pytest.approx(sft.item(), rel=1e-7)


def _pear_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[float]]]:
    """(policy logits, reference logits, labels, per-row log-ratios before clipping): sequence 0 has rows 0–2 with
    p = ½, ¼, 0.6 and log p − log q = 0.1, −0.5, 0.2; sequence 1 has rows 1–2 with p = ½ and log-ratios 0.3, 0."""
    probs = [[0.5, 0.25, 0.6, 0.5], [0.5, 0.5, 0.5, 0.5]]
    deltas = [[0.1, -0.5, 0.2, 0.0], [0.0, 0.3, 0.0, 0.0]]
    ref_probs = [[p * math.exp(-d) for p, d in zip(row, drow)] for row, drow in zip(probs, deltas)]
    labels = torch.tensor([[-100, 0, 0, 0], [-100, -100, 0, 0]])
    return _two_token_logits(probs), _two_token_logits(ref_probs), labels, deltas


def test_pear_token_level_weights_are_clipped_discounted_suffix_ratios():
    # clipped log-ratios (−0.08, 0.3): sequence 0: 0.1, −0.08, 0.2; sequence 1: 0.3, 0. With γ = 0.9:
    # w = γ^{#later} · exp(Σ later): seq 0: 0.81·e^{0.12}, 0.9·e^{0.2}, 1; seq 1: 0.9·e^{0}, 1
    logits, ref, labels, _ = _pear_batch()
    logits.requires_grad_()
    loss, metrics = compute_token_loss("pear", logits, labels, ref, gamma=0.9)
    weights = [0.81 * math.exp(0.12), 0.9 * math.exp(0.2), 1.0, 0.9, 1.0]
    logps = [math.log(0.5), math.log(0.25), math.log(0.6), math.log(0.5), math.log(0.5)]
    assert loss.item() == pytest.approx(-sum(w * lp for w, lp in zip(weights, logps)) / 5, rel=1e-6)
    assert metrics["pear_weight_mean"].item() == pytest.approx(sum(weights) / 5, rel=1e-6)
    assert metrics["pear_weight_max"].item() == pytest.approx(max(weights), rel=1e-6)
    loss.backward()  # the weight is detached: row 0's gradient is w_0 (p − e_y) / |T|
    torch.testing.assert_close(logits.grad[0, 0], weights[0] * torch.tensor([-0.5, 0.5]) / 5)
    # the weight clip binds: weight_high = 0.95 caps rows 1 of seq 0 (0.9·e^0.2 = 1.099) and the last rows (1)
    capped, _ = compute_token_loss("pear", logits.detach(), labels, ref, gamma=0.9, weight_high=0.95)
    weights = [min(w, 0.95) for w in weights]
    assert capped.item() == pytest.approx(-sum(w * lp for w, lp in zip(weights, logps)) / 5, rel=1e-6)


def test_pear_sequence_level_weight_is_the_clipped_ratio_of_the_whole_response():
    # seq 0: exp(0.1 − 0.08 + 0.2) = e^{0.22} on all three rows; seq 1: e^{0.3}
    logits, ref, labels, _ = _pear_batch()
    loss, _ = compute_token_loss("pear", logits, labels, ref, level="sequence")
    logps = [math.log(0.5), math.log(0.25), math.log(0.6), math.log(0.5), math.log(0.5)]
    weights = [math.exp(0.22)] * 3 + [math.exp(0.3)] * 2
    assert loss.item() == pytest.approx(-sum(w * lp for w, lp in zip(weights, logps)) / 5, rel=1e-6)
    # policy = reference: every ratio is 1 and the sequence level is SFT (the token level still discounts)
    same, _ = compute_token_loss("pear", logits, labels, logits, level="sequence")
    assert same.item() == pytest.approx(compute_token_loss("sft", logits, labels)[0].item(), rel=1e-7)


# ------------------------------------------------------------------------------------------ EKSFT arms of issue 27


def _fork_world_response() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, reference logits, labels) of one forking-world-like sequence, V = 8: a 4-token prompt, then a 14-token
    response whose first token (position 4) is the fork, predicted by the last prompt row 3, which is uniform over the
    three strategy tokens {0, 1, 2} (H = ln 3). Every other row is near-deterministic (margin 8) except rows 10 and 12
    (margin 4, H = 0.58); the reference equals the policy except at rows 11 and 13, so only they have KL > 0."""
    length, vocab = 18, 8
    labels = torch.full((1, length), -100)
    labels[0, 4:] = torch.tensor([0] + [3 + i % 5 for i in range(13)])
    logits = torch.zeros(1, length, vocab)
    for row in range(length):
        target = int(labels[0, row + 1]) if row + 1 < length and labels[0, row + 1] >= 0 else 3
        logits[0, row, target] = 4.0 if row in (10, 12) else 8.0
    logits[0, 3] = torch.tensor([0.0, 0.0, 0.0] + [-20.0] * 5)
    ref = logits.clone()
    ref[0, 11, 0] += 3.0
    ref[0, 13, 1] += 2.0
    return logits, ref, labels


def _weights(method: SFTMethod, logits: torch.Tensor, labels: torch.Tensor, ref: torch.Tensor):
    """(prediction rows, TokenWeights) of ``method`` on dense logits, as the loss head weighs them."""
    loss = build_loss(method)
    rows = prediction_rows(labels, loss.uses_label_positions)
    values = row_terms(logits.flatten(0, 1)[rows.index], rows.targets, loss.stats,
                       ref_logits=ref.flatten(0, 1)[rows.index])
    stats = TokenStats(values=values, targets=rows.targets, has_target=rows.has_target,
                       is_label_position=rows.is_label_position, sequence=rows.sequence,
                       num_sequences=rows.num_sequences, vocab_size=logits.shape[-1])
    return rows, loss.weigh(stats)


def test_official_aligned_masks_the_fork_row_and_the_official_preset_does_not():
    logits, ref, labels = _fork_world_response()
    official = compose(["sft/method=eksft_official"]).sft.method
    aligned = compose(["sft/method=eksft_official_aligned"]).sft.method
    assert aligned.resolved() == {**official.resolved(), "mask_alignment": "paper"}
    fork_row = 3
    for method, fork_masked in ((official, False), (aligned, True)):
        rows, weights = _weights(method, logits, labels, ref)
        position = rows.index.tolist().index(fork_row)
        assert (weights.coefs["logp"][position] == 0).item() is fork_masked, method.mask_alignment
    # official: k = ⌊0.2·14⌋ = 2 label positions each: M_H = {10, 12}, M_KL = {11, 13} ⇒ rows 9–12 lose their CE and
    # the fork row keeps it; aligned: M_H = {3, 10}, M_KL = {11, 13} ⇒ the fork row's own CE goes.
    for method, ce_rows in ((official, 10), (aligned, 10)):
        for key in ("lambda_entropy", "lambda_kl"):
            setattr(method, key, 0.0)
        lg = logits.clone().requires_grad_()
        loss, metrics = compute_token_loss(method, lg, labels, ref)
        loss.backward()
        assert metrics["num_CE"].item() == ce_rows
        fork_grad = lg.grad[0, fork_row]
        if method.mask_alignment is None:  # official: the full CE gradient (p − e_y)/|C| on the fork row
            expected = torch.tensor([-2 / 3, 1 / 3, 1 / 3] + [0.0] * 5) / ce_rows
            torch.testing.assert_close(fork_grad, expected, rtol=1e-4, atol=1e-8)
        else:  # aligned: selected ⇒ no CE ⇒ with λ = 0 no gradient at all
            assert (fork_grad == 0).all()


def test_random_matched_masks_as_many_rows_as_the_topk_selection():
    torch.manual_seed(11)
    labels = torch.randint(0, 9, (2, 20))
    labels[1, :5] = -100
    logits, ref = torch.randn(2, 20, 9), torch.randn(2, 20, 9)
    topk = compute_token_loss("eksft", logits, labels, ref)[1]
    masks = []
    for seed in (0, 0, 1):
        lg = logits.clone().requires_grad_()
        loss, metrics = compute_token_loss("eksft", lg, labels, ref, selection="random_matched", random_mask_seed=seed,
                                           lambda_entropy=0.0, lambda_kl=0.0)
        loss.backward()
        assert metrics["num_M"].item() == topk["num_M"].item() > math.ceil(0.1 * 34)  # not the fixed 10% of |T|
        masks.append(lg.grad.abs().sum(-1) == 0)
    assert torch.equal(masks[0], masks[1]) and not torch.equal(masks[0], masks[2])
    assert build_loss(compose(["sft/method=eksft_random_mask_matched"]).sft.method).cfg.selection == "random_matched"


def test_resolved_switches_drive_the_class_the_scope_and_the_loss_norm():
    step = EKSFTMethod(selection_scope="optimizer_batch")
    assert step.resolved()["loss_norm"] == "optimizer_batch_parts"
    assert SFTConfig(method=step).resolved_method()["loss_norm"] == "optimizer_batch_parts"
    loss = build_loss(step)
    assert type(loss) is EKSFTLoss and loss.selects_over_step  # the paper's equations, one group per step
    assert not build_loss(EKSFTMethod()).selects_over_step
    official_step = build_loss(EKSFTMethod(compat="official_code", selection_scope="optimizer_batch"))
    assert type(official_step) is EKSFTVariantsLoss and official_step.selects_over_step
    assert official_step.switches["loss_norm"] == "optimizer_batch_parts"  # one objective, not GA × the mean
    with pytest.raises(ConfigError, match="sft.method.loss_norm"):
        EKSFTMethod(selection_scope="optimizer_batch", loss_norm="micro_batch_mean").validate()
    # the manifest's record: every switch resolved, and the normalisation the trainer applies
    record = compose(["sft/method=eksft_official", "sft.loss_norm=global_token_mean"]).sft.resolved_method()
    assert record["mask_alignment"] == "official_code" and record["dynamic_lambda"] is True
    assert record["loss_norm"] == "micro_batch_sum" and None not in record.values()
    assert compose(["sft/method=eksft"]).sft.resolved_method()["loss_norm"] == "micro_batch_mean"


def test_optimizer_batch_selection_equals_one_micro_batch_holding_the_step():
    """Algorithm 1: one top-k over every row of the step. Statistics of three micro-batches, weighed together and
    split back, give the loss and the gradients of one micro-batch of all four sequences with the micro-batch scope."""
    torch.manual_seed(12)
    lengths, width, vocab = [9, 7, 6, 4], 6, 11
    hidden = [torch.randn(n, width) for n in lengths]
    ref_hidden = [torch.randn(n, width) for n in lengths]
    weight = torch.randn(vocab, width)
    labels = [torch.cat([torch.full((2,), -100), torch.randint(0, vocab, (n - 2,))]) for n in lengths]
    params = dict(rho=0.3, lambda_entropy=0.2, lambda_kl=0.4)

    def padded(items, fill):
        return torch.stack([torch.cat([x, x.new_full((max(lengths) - len(x), *x.shape[1:]), fill)]) for x in items])

    whole_h, whole_w = padded(hidden, 0.0).requires_grad_(), weight.clone().requires_grad_()
    whole = chunked_loss(build_loss(EKSFTMethod(**params)), whole_h, whole_w, padded(labels, -100), chunk_size=5,
                         ref_hidden=padded(ref_hidden, 0.0), ref_head_weight=weight)
    whole.loss.backward()

    loss = build_loss(EKSFTMethod(selection_scope="optimizer_batch", **params))
    groups = [[0, 1], [2], [3]]
    inputs = [(padded([hidden[i] for i in g], 0.0).requires_grad_(), padded([labels[i] for i in g], -100),
               padded([ref_hidden[i] for i in g], 0.0)) for g in groups]
    stats = [chunked_statistics(loss, h, weight, y, chunk_size=5, ref_hidden=r, ref_head_weight=weight)
             for h, y, r in inputs]
    step = loss.weigh(TokenStats.concat(stats))
    w = weight.clone().requires_grad_()
    total = 0.0
    for (h, y, r), share in zip(inputs, step.split([s.num_rows for s in stats])):
        result = chunked_loss(loss, h, w, y, chunk_size=5, ref_hidden=r, ref_head_weight=weight, weights=share)
        result.loss.backward()
        total = total + result.loss.detach()
        assert all(torch.equal(result.metrics[key], whole.metrics[key]) for key in ("num_M", "num_M_H", "num_M_KL"))
    assert whole.metrics["num_M"].item() > 0
    torch.testing.assert_close(total, whole.loss.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(w.grad, whole_w.grad, rtol=1e-5, atol=1e-7)
    for (h, _, _), g in zip(inputs, groups):
        for row, i in enumerate(g):
            torch.testing.assert_close(h.grad[row, :lengths[i]], whole_h.grad[i, :lengths[i]], rtol=1e-5, atol=1e-7)
