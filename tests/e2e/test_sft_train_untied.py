"""tests/integration/test_sft_train.py's two launch tests on the untied head (Qwen3-8B's layout): 2 ranks match 1
rank, and a SIGKILL then resume matches the uninterrupted run. The default suite runs both on the tied head, and
covers the untied head's checkpoints (the in-process resume tests there, on both heads) and its 2-rank loading
(tests/integration/test_sharded_load.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
import test_sft_train as default_tier  # noqa: E402
from test_sft_train import model_dir, reference  # noqa: E402,F401 (its fixtures)

pytestmark = pytest.mark.e2e
UNTIED_HEAD = pytest.mark.parametrize("model_dir", ["untied"], indirect=True)


@UNTIED_HEAD
def test_two_ranks_match_one_rank_with_an_untied_head(tmp_path, model_dir, reference):
    default_tier.test_two_ranks_match_one_rank(tmp_path, model_dir, reference)


@UNTIED_HEAD
def test_sigkill_then_resume_matches_uninterrupted_with_an_untied_head(tmp_path, model_dir, reference):
    default_tier.test_sigkill_then_resume_matches_uninterrupted(tmp_path, model_dir, reference)
