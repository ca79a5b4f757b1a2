"""``bench.statistics_pass`` refuses a loss without statistics (SFT, DFT: no pass A) by name, with the choices, instead
of timing two empty passes and printing a meaningless speed-up."""
from __future__ import annotations

import pytest

from bench import statistics_pass


def test_a_method_without_statistics_is_refused_with_the_methods_that_have_them(capsys):
    with pytest.raises(SystemExit) as exit_info:
        statistics_pass.main(["--method", "sft", "--rows", "4", "--vocab", "16", "--hidden", "8"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--method sft declares no statistics" in error
    assert "methods with one: asft, eaft, eksft," in error and " sft" not in error.split("one:")[1]
