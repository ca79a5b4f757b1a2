"""Judge process for ``eval.scoring``: writes ``ready`` once math-verify is imported, then reads
``{"answer", "gold", "timeout"}`` JSON lines and writes a verdict line for each: ``1`` (equal), ``0`` (not), or ``t``
(not shown equal, and math-verify's timeout fired on a parse or a comparison, so the time limit decided it).

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

CORRECT, WRONG, TIME_LIMITED = "1", "0", "t"
READY = "ready"
"""The line written once math-verify is imported and has judged once (the parent counts no time limit before it)."""
STARTUP_JUDGE_TIMEOUT = 60
"""math-verify's timeout for that first judgement."""
ADDRESS_SPACE_BYTES = 4 << 30
"""Virtual memory cap of a judge process."""


def judge(answer: str, gold: str, timeout: int) -> str:
    """:data:`CORRECT`, :data:`WRONG` or :data:`TIME_LIMITED`. The verdict is math-verify's
    ``verify(parse(gold), parse(answer))``, taken pair by pair over the parsed candidates as ``verify`` itself does
    (an error in one pair counts as not equal), with its timeouts told apart from its other failures."""
    from itertools import product

    from math_verify import parse, verify
    from math_verify.errors import TimeoutException
    from math_verify.parser import LatexExtractionConfig

    try:
        gold_parsed = parse(f"${gold}$", parsing_timeout=timeout, raise_on_error=True)
        predicted = parse(f"\\boxed{{{answer}}}", extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
                          parsing_timeout=timeout, raise_on_error=True)
    except TimeoutException:
        return TIME_LIMITED
    except Exception:
        return WRONG
    timed_out = False
    for gold_candidate, candidate in product(gold_parsed, predicted):
        try:
            if verify(gold_candidate, candidate, timeout_seconds=timeout, raise_on_error=True):
                return CORRECT
        except TimeoutException:
            timed_out = True
        except Exception:
            pass
    return TIME_LIMITED if timed_out else WRONG


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; we exit on stdin EOF
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = ADDRESS_SPACE_BYTES if hard == resource.RLIM_INFINITY else min(ADDRESS_SPACE_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    logging.disable(logging.CRITICAL)
    if judge("1", "1", STARTUP_JUDGE_TIMEOUT) != CORRECT:  # imports and first-use set-up, so no request pays
        sys.exit("math-verify does not judge 1 = 1: is it installed?")
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.write(judge(request["answer"], request["gold"], request["timeout"]) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
