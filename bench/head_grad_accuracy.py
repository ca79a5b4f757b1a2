"""Accuracy of the LM head's weight gradient in bf16: the chunked head and plain bf16 autograd, each against fp64.

    python -m bench.head_grad_accuracy                        # CPU: V 512, d 64, 320 rows in 80 chunks of 4
    python -m bench.head_grad_accuracy --device cuda --vocab 151936 --hidden 2560 --rows 8192 --chunk-size 256

Under FSDP2 mixed precision (the GPU profile) the head weight reaching ``sft.token_stats.chunked_loss`` is bf16.
Three computations differentiate one objective on the same bf16 hidden states and weights:

* ``chunked``: the trainer's head, ``chunk_size`` rows at a time (the weight gradient summed over the chunks);
* ``plain``: plain autograd on the bf16 logits ``h @ Wᵀ``, whose weight gradient is one bf16 GEMM of the bf16
  logit gradients with ``h``; the logit gradients are formed by autograd ``block`` rows at a time (the objective is
  a sum over rows once the selection is fixed), so only they, ``rows × vocab`` in bf16, are held at once;
* ``fp64``: the chunked head on fp64 copies of the same inputs (the reference; its per-chunk logit gradients are
  formed in fp32, an error floor near 1e-7).

A loss that selects tokens (EKSFT's mask) selects them once, from the bf16 chunked head's statistics, and the other
two reuse that selection (:class:`FixedSelection`): near-ties at the top-ρ boundary would otherwise flip between
precisions and swamp the rounding being measured. Printed: ‖g − g_fp64‖ / ‖g_fp64‖ of each and their ratio.
"""
from __future__ import annotations

import argparse
from typing import Any

import torch

from sft.token_stats import TokenStats, TokenWeights, chunked_loss, dense_loss, prediction_rows, row_terms


class FixedSelection:
    """A token loss whose :meth:`weigh` returns the weights of its first call: one selection for every precision."""

    def __init__(self, loss: Any):
        self._loss = loss
        self.weights: TokenWeights | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loss, name)

    def weigh(self, stats: TokenStats) -> TokenWeights:
        if self.weights is None:
            self.weights = self._loss.weigh(stats)
        return self.weights


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ (Frobenius, in fp64)."""
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm().clamp(min=1e-300)).item()


def weight_grad(loss: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_size: int,
                ref_hidden: torch.Tensor | None, ref_weight: torch.Tensor | None, dense: bool) -> torch.Tensor:
    """The gradient of ``loss`` with respect to the head ``weight`` (chunked head, or autograd on dense logits)."""
    weight = weight.detach().clone().requires_grad_()
    if dense:
        ref_logits = None if ref_hidden is None else ref_hidden @ ref_weight.T
        dense_loss(loss, hidden @ weight.T, labels, ref_logits=ref_logits).loss.backward()
    else:
        chunked_loss(loss, hidden, weight, labels, chunk_size=chunk_size, ref_hidden=ref_hidden,
                     ref_head_weight=ref_weight).loss.backward()
    return weight.grad


def plain_weight_grad(fixed: FixedSelection, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                      ref_hidden: torch.Tensor | None, ref_weight: torch.Tensor | None, block: int) -> torch.Tensor:
    """Plain bf16 autograd's weight gradient for ``fixed``'s selection (``weigh`` called once already): the bf16
    gradient of each row's logits by autograd through the fp32 terms of ``dense_loss``, ``block`` rows at a time,
    then one bf16 GEMM with the hidden states, as ``(h @ Wᵀ).backward`` does."""
    rows = prediction_rows(labels, fixed.uses_label_positions)
    hidden_nd = hidden.detach().flatten(0, 1).index_select(0, rows.index)
    ref_nd = None if ref_hidden is None else ref_hidden.detach().flatten(0, 1).index_select(0, rows.index)
    coefs = fixed.weights.coefs
    grad_logits = hidden_nd.new_empty(hidden_nd.shape[0], weight.shape[0])
    for start in range(0, hidden_nd.shape[0], block):
        part = slice(start, start + block)
        logits = (hidden_nd[part] @ weight.detach().T).requires_grad_()
        ref_logits = None if ref_nd is None else (ref_nd[part] @ ref_weight.T).float()
        terms = row_terms(logits.float(), rows.targets[part], list(coefs), ref_logits=ref_logits,
                          **fixed.term_options)
        sum(coefs[name][part].to(terms[name].dtype) @ terms[name] for name in coefs).backward()
        grad_logits[part] = logits.grad
    return grad_logits.T @ hidden_nd


def head_grad_errors(loss: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_size: int,
                     ref_hidden: torch.Tensor | None = None, ref_weight: torch.Tensor | None = None,
                     plain: bool = True) -> dict[str, float]:
    """Relative errors against fp64 of the bf16 chunked head's weight gradient (``chunked``) and, when ``plain``,
    of plain bf16 autograd's (``plain``, :func:`plain_weight_grad`); ``hidden [B, L, d]``, ``weight [V, d]`` and
    the reference's in bf16."""
    fixed = FixedSelection(loss)
    chunked = weight_grad(fixed, hidden, weight, labels, chunk_size, ref_hidden, ref_weight, dense=False)
    as64 = lambda tensor: None if tensor is None else tensor.double()  # noqa: E731
    exact = weight_grad(fixed, hidden.double(), weight.double(), labels, chunk_size, as64(ref_hidden),
                        as64(ref_weight), dense=False)
    errors = {"chunked": relative_error(chunked, exact)}
    del chunked
    if plain:
        errors["plain"] = relative_error(
            plain_weight_grad(fixed, hidden, weight, labels, ref_hidden, ref_weight, block=chunk_size), exact)
    return errors


def random_head(vocab: int, hidden_size: int, rows: int, device: str, seed: int = 0,
                reference: bool = False) -> dict[str, torch.Tensor | None]:
    """bf16 inputs of one micro-batch: hidden states ``[1, rows, d]`` and a head ``[V, d]`` scaled like a trained
    model's (logits of order 1), random targets (the first row a prompt), and with ``reference`` a perturbed
    reference (so EKSFT's KL mask is not empty)."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(1, rows, hidden_size, generator=generator)
    weight = torch.randn(vocab, hidden_size, generator=generator) / hidden_size ** 0.5
    labels = torch.randint(0, vocab, (1, rows), generator=generator)
    labels[0, 0] = -100
    ref_hidden = ref_weight = None
    if reference:
        ref_hidden = (hidden + 0.3 * torch.randn(hidden.shape, generator=generator)).bfloat16().to(device)
        ref_weight = (weight + 0.05 * torch.randn(weight.shape, generator=generator) / hidden_size ** 0.5
                      ).bfloat16().to(device)
    return {"hidden": hidden.bfloat16().to(device), "weight": weight.bfloat16().to(device),
            "labels": labels.to(device), "ref_hidden": ref_hidden, "ref_weight": ref_weight}


def main() -> None:
    from common.config.sft import EKSFTMethod, SFTMethod
    from sft.losses import build_loss

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--rows", type=int, default=320)
    parser.add_argument("--chunk-size", type=int, default=4)
    args = parser.parse_args()
    chunks = -(-args.rows // args.chunk_size)
    print(f"{args.device}: V {args.vocab}, d {args.hidden}, {args.rows} rows in {chunks} chunks of "
          f"{args.chunk_size}; weight-gradient error against fp64")
    for method in (SFTMethod(), EKSFTMethod()):
        loss = build_loss(method)
        inputs = random_head(args.vocab, args.hidden, args.rows, args.device, reference=loss.needs_reference)
        errors = head_grad_errors(loss, inputs["hidden"], inputs["weight"], inputs["labels"], args.chunk_size,
                                  inputs["ref_hidden"], inputs["ref_weight"])
        print(f"  {method.name:6s} chunked {errors['chunked']:.2e}   plain bf16 autograd {errors['plain']:.2e}   "
              f"chunked / plain {errors['chunked'] / errors['plain']:.2f}")


if __name__ == "__main__":
    main()
