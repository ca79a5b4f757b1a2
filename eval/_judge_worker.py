"""Judge process for ``eval.scoring``: writes ``ready`` once math-verify is imported, then reads
``{"answer", "gold", "timeout"}`` JSON lines and writes a ``1`` or ``0`` line for each.

Runs math-verify on this process's main thread, so its ``signal.alarm`` timeouts work; the parent enforces a wall
limit on top and kills this process if it overruns. Address space is capped so a huge integer raises MemoryError
instead of swapping the machine. Exits when its stdin closes (the parent exited or dropped it).
"""
from __future__ import annotations

import json
import logging
import resource
import signal
import sys

READY = "ready"
"""The line written once math-verify is imported and has judged once (the parent counts no time limit before it)."""
STARTUP_JUDGE_TIMEOUT = 60
"""math-verify's timeout for that first judgement."""
ADDRESS_SPACE_BYTES = 4 << 30
"""Virtual memory cap of a judge process."""


def judge(answer: str, gold: str, timeout: int) -> bool:
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException
    from math_verify.parser import LatexExtractionConfig

    try:
        gold_parsed = parse(f"${gold}$", parsing_timeout=timeout)
        predicted = parse(f"\\boxed{{{answer}}}", extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
                          parsing_timeout=timeout)
        return bool(gold_parsed and predicted and verify(gold_parsed, predicted, timeout_seconds=timeout))
    except (Exception, TimeoutException):
        return False


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; we exit on stdin EOF
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = ADDRESS_SPACE_BYTES if hard == resource.RLIM_INFINITY else min(ADDRESS_SPACE_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    logging.disable(logging.CRITICAL)
    if not judge("1", "1", STARTUP_JUDGE_TIMEOUT):  # imports and first-use set-up, so no request pays for them
        sys.exit("math-verify does not judge 1 = 1: is it installed?")
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        verdict = judge(request["answer"], request["gold"], request["timeout"])
        sys.stdout.write("1\n" if verdict else "0\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
