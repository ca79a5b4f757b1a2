"""The token losses of :mod:`sft.losses` inside other trainers: TRL's ``SFTTrainer`` (:mod:`sft.integrations.trl`,
needs the ``trl`` extra) and the plain HF ``Trainer`` (:mod:`sft.integrations.hf`). docs/trl.md."""
