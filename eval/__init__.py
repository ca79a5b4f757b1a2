"""Evaluation: vLLM sampling, the math-verify scorer shared with the RL reward, avg@n / pass@k, tables and plots."""
