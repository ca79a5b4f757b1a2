"""RL stage: DAPO with verl on Ray, from an SFT checkpoint (or the base model) to a merged HF model."""
