"""The one answer scorer of the project: evaluation verdicts and the RL reward both call :func:`verify`.

Rule (LUFFY's reward; docs/evaluation.md):

1. The answer region is the text after the last ``</think>``; a ``<think>`` that is never closed scores 0
   (the model ran out of tokens while thinking), and an answer only inside ``<think>…</think>`` does not count.
2. The answer is the content of the last complete ``\\boxed{…}`` (braces balanced) in the last
   :data:`MAX_REGION_CHARS` characters of that region; no box, 0.
3. math-verify decides: ``verify(parse("$" + gold + "$"), parse("\\boxed{" + answer + "}"))``.

Time limit. ``timeout_s`` counts from the call to :func:`verify`: extraction (one pass over a capped region), waiting
for a judge process, and judging. math-verify's own timeouts use ``signal.alarm``, which only works on a process's
main thread, and a C-level big-integer operation is not interruptible by a signal at all. So :func:`verify` never
calls math-verify in the caller's process: a cheap bounded pre-filter rejects answers that are too long, too deeply
nested or exponent towers, and the rest is judged in a pool of long-lived worker processes
(``eval/_judge_worker.py``). A caller that finds every judge busy starts another (up to :data:`MAX_JUDGES`), so a slow
answer never holds up another; starting one (its math-verify import, once per process) is the only time not counted.
Inside a worker math-verify runs on the worker's main thread with its own timeouts; the caller waits at most until
its deadline and kills and replaces a worker that overruns (or dies), scoring the sample 0. Past ``MAX_JUDGES``
concurrent callers, a caller that gets no judge before its deadline scores 0. This works the same from the main
thread, from worker threads (verl's reward loop) and from daemon processes. Nothing in a model's output is ever
executed: the only interpretation is math-verify's LaTeX parser.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from eval._judge_worker import CORRECT, READY, TIME_LIMITED, WRONG
from common.answers import last_boxed

TIMEOUT_S = 5.0
"""Wall-clock limit per sample, from the call to :func:`verify` to its verdict (queueing included), then it scores 0."""
MAX_REGION_CHARS = 100_000
"""Only the last this many characters of the answer region are searched for the box (the paper's 8,192-token
responses are ~30k characters; the answer must end within it anyway, being the last box and at most
:data:`MAX_ANSWER_CHARS` long)."""
MAX_ANSWER_CHARS = 1000
"""Longer boxed answers score 0 without parsing (every benchmark gold is under 60 characters)."""
MAX_NESTING = 24
"""Deeper bracket nesting ({[( combined) scores 0 without parsing (the LaTeX parser recurses per level)."""
MAX_EXPONENT_DEPTH = 2
"""Exponent towers deeper than ``a^{b^{c}}`` score 0 without parsing."""
MAX_WORKERS = min(4, os.cpu_count() or 1)
"""Threads that score at once in ``eval.run`` (each keeps one judge process busy)."""
MAX_JUDGES = 32
"""Judge processes at most (~60 MB each, started only while every started one is busy)."""
STARTUP_TIMEOUT_S = 120.0
"""A judge process that has not imported math-verify after this long is a broken installation (an error)."""

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_OPENERS, _CLOSERS = "{[(", "}])"
_WORKER_SCRIPT = Path(__file__).with_name("_judge_worker.py")


def answer_region(solution_str: str) -> str | None:
    """The text after the last ``</think>``; the whole text without think tags; None if ``<think>`` never closes."""
    close = solution_str.rfind(_THINK_CLOSE)
    if close >= 0:
        return solution_str[close + len(_THINK_CLOSE):]
    if _THINK_OPEN in solution_str:
        return None
    return solution_str


def extract_answer(solution_str: str) -> str | None:
    """The answer :func:`verify` judges (stripped boxed content), or None when there is none.

    Only the last :data:`MAX_REGION_CHARS` characters of the answer region are read, before any parsing.
    """
    region = answer_region(solution_str)
    if region is None:
        return None
    boxed = last_boxed(region[-MAX_REGION_CHARS:])
    return boxed.strip() if boxed is not None else None


def too_complex(answer: str) -> bool:
    """True when ``answer`` exceeds the pre-filter bounds (length, bracket nesting, exponent-tower depth)."""
    if len(answer) > MAX_ANSWER_CHARS:
        return True
    depth = max_depth = 0
    exponent_depths: list[int] = []  # bracket depth at which each open exponent group started
    pending_exponent = False
    for char in answer:
        if char in _OPENERS:
            depth += 1
            max_depth = max(max_depth, depth)
            if pending_exponent:
                exponent_depths.append(depth)
                if len(exponent_depths) > MAX_EXPONENT_DEPTH:
                    return True
        elif char in _CLOSERS:
            if exponent_depths and exponent_depths[-1] == depth:
                exponent_depths.pop()
            depth -= 1
        pending_exponent = char == "^"
        if max_depth > MAX_NESTING:
            return True
    return False


def verify(solution_str: str, ground_truth: str, *, timeout_s: float = TIMEOUT_S) -> float:
    """1.0 if the last boxed answer after ``</think>`` in ``solution_str`` equals ``ground_truth`` by math-verify, else 0.0.

    Never raises for any model output; returns within about ``timeout_s`` seconds of the call, waiting for a judge
    included (plus, once per judge process, its start-up); safe from any thread.
    """
    return 1.0 if verdict(solution_str, ground_truth, timeout_s=timeout_s) == CORRECT else 0.0


def verdict(solution_str: str, ground_truth: str, *, timeout_s: float = TIMEOUT_S) -> str:
    """:func:`verify`'s judgement: ``CORRECT``; ``WRONG``; or ``TIME_LIMITED`` (it scores 0 too) when the answer
    was not shown equal and the time limit decided it: no judge was free, the judge overran the deadline, or
    math-verify's own timeout fired. The evaluation counts those, since a loaded machine makes them more frequent."""
    deadline = time.monotonic() + timeout_s
    answer = extract_answer(solution_str)
    if not answer or too_complex(answer):
        return WRONG
    return _POOL.judge(answer, ground_truth, deadline)


class _JudgeWorker:
    """One started ``_judge_worker.py`` process: a JSON line in (answer, gold, timeout), a verdict line out."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-u", str(_WORKER_SCRIPT)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        bufsize=1)
        if self._read_line(time.monotonic() + STARTUP_TIMEOUT_S) != READY:
            self.close()
            raise RuntimeError(f"the judge process {_WORKER_SCRIPT} did not start within {STARTUP_TIMEOUT_S:.0f} s "
                               f"(exit code {self.process.returncode}); run it with python to see why")

    def judge(self, answer: str, gold: str, deadline: float) -> str | None:
        """The verdict, or None when the worker did not answer before ``deadline`` or died (the caller discards it)."""
        # math-verify's own per-call timeout (parse gold, parse answer, verify) fires first in the usual case,
        # so a slow sample costs no worker restart; the deadline catches what a signal cannot interrupt.
        timeout = max(1, round((deadline - time.monotonic()) / 2))
        try:
            self.process.stdin.write(json.dumps({"answer": answer, "gold": gold, "timeout": timeout}) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self._read_line(deadline)

    def _read_line(self, deadline: float) -> str | None:
        """The next line the worker writes, stripped; None if none comes before ``deadline`` or the worker exited."""
        while (remaining := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.process.stdout], [], [], remaining)
            if readable:
                line = self.process.stdout.readline()
                return line.strip() if line else None
        return None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class _JudgePool:
    """Judge processes shared by every thread: an idle one is reused, another is started while all are busy (up to
    ``max_judges``), and one that overruns its caller's deadline is killed (a later caller starts a new one)."""

    def __init__(self, max_judges: int = MAX_JUDGES):
        self._max_judges = max_judges
        self._pid = os.getpid()
        self._idle: list[_JudgeWorker] = []
        self._all: set[_JudgeWorker] = set()
        self._num_started = 0
        """Judges running or being started."""
        self._changed = threading.Condition()

    def judge(self, answer: str, gold: str, deadline: float) -> str:
        """The worker's verdict (``CORRECT``, ``WRONG``, ``TIME_LIMITED``); ``TIME_LIMITED`` when no judge is free
        before ``deadline`` (``time.monotonic()``) or the judge overruns it. Starting a judge for this call moves
        the deadline by the start-up time."""
        if os.getpid() != self._pid:  # a forked child must not share its parent's worker pipes
            self.__init__(self._max_judges)
        worker, deadline = self._acquire(deadline)
        if worker is None:
            return TIME_LIMITED
        if time.monotonic() >= deadline:
            result = TIME_LIMITED
        elif (result := worker.judge(answer, gold, deadline)) is None:
            self._discard(worker)
            return TIME_LIMITED
        with self._changed:
            self._idle.append(worker)
            self._changed.notify()
        return result

    def _acquire(self, deadline: float) -> tuple[_JudgeWorker | None, float]:
        """An idle judge, else a newly started one (and the deadline moved by its start-up), else the first judge freed
        before ``deadline``; None if there is none by then."""
        with self._changed:
            while not self._idle and self._num_started >= self._max_judges:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None, deadline
                self._changed.wait(remaining)
            if self._idle:
                return self._idle.pop(), deadline
            self._num_started += 1
        started = time.monotonic()
        try:
            worker = _JudgeWorker()
        except BaseException:
            self._forget(None)
            raise
        with self._changed:
            self._all.add(worker)
        return worker, deadline + (time.monotonic() - started)

    def _discard(self, worker: _JudgeWorker) -> None:
        worker.close()
        self._forget(worker)

    def _forget(self, worker: _JudgeWorker | None) -> None:
        with self._changed:
            self._all.discard(worker)
            self._num_started -= 1
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            workers, self._all, self._idle, self._num_started = list(self._all), set(), [], 0
        for worker in workers:
            worker.close()


_POOL = _JudgePool()
atexit.register(_POOL.close)
