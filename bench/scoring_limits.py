"""The scorer's time limits under adversarial and concurrent input (``eval.scoring.verify``).

    python -m bench.scoring_limits
    python -m bench.scoring_limits --slow 31 --limit 5

1. Nested boxes ``\\boxed{\\boxed{…5…}}`` of 8, 32 and 64 KB: seconds for ``extract_answer`` and for ``verify``
   (target: 64 KB under 1 s; a per-box rescan is quadratic and took 62 s).
2. ``--slow`` answers that math-verify spends its whole own timeout on (``99999999!``) and one correct answer, all
   submitted at once from their own threads: the correct one's seconds and the slowest slow one's (target: both
   within ``--limit``, and the correct one done before the first slow one). A first round of as many slow answers
   starts the judge processes, whose start-up is not part of the limit.
"""
from __future__ import annotations

import argparse
import threading
import time

from eval.scoring import extract_answer, verify

SLOW_ANSWER = "\\boxed{99999999!}"


def nested_boxes(num_bytes: int) -> str:
    depth = num_bytes // len("\\boxed{}")
    return "\\boxed{" * depth + "5" + "}" * depth


def concurrent(solutions: list[str], limit: float) -> list[tuple[float, float]]:
    """(verdict, seconds) of ``verify(solution, "5")`` for each solution, each from its own thread, started in order."""
    results: list[tuple[float, float]] = [(0.0, 0.0)] * len(solutions)

    def judge(index: int) -> None:
        start = time.monotonic()
        results[index] = (verify(solutions[index], "5", timeout_s=limit), time.monotonic() - start)

    threads = [threading.Thread(target=judge, args=(index,)) for index in range(len(solutions))]
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=15, help="slow answers submitted with the correct one")
    parser.add_argument("--limit", type=float, default=5.0, help="verify's timeout_s")
    args = parser.parse_args()

    verify("\\boxed{5}", "5")
    for kilobytes in (8, 32, 64):
        solution = nested_boxes(kilobytes * 1024)
        start = time.monotonic()
        answer = extract_answer(solution)
        extracted = time.monotonic() - start
        start = time.monotonic()
        verdict = verify(solution, "5", timeout_s=args.limit)
        print(f"nested boxes {kilobytes:2d} KB: extract {extracted:.3f} s ({answer!r}), "
              f"verify {time.monotonic() - start:.3f} s ({verdict})")

    start = time.monotonic()
    concurrent([SLOW_ANSWER] * (args.slow + 1), args.limit)
    print(f"judges started for {args.slow + 1} concurrent callers in {time.monotonic() - start:.1f} s")
    results = concurrent([SLOW_ANSWER] * args.slow + ["\\boxed{\\frac{10}{2}}"], args.limit)
    slow, (verdict, seconds) = [s for _, s in results[:-1]], results[-1]
    print(f"{args.slow} slow + 1 correct at once, limit {args.limit:g} s: correct one {verdict} after {seconds:.2f} s; "
          f"slow ones {min(slow):.2f}-{max(slow):.2f} s (all 0: {all(v == 0.0 for v, _ in results[:-1])})")


if __name__ == "__main__":
    main()
