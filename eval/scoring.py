"""The one answer scorer of the project: evaluation verdicts and the RL reward both call :func:`verify`.

Rule (LUFFY's reward, methods_spec §7, data_notes §3):

1. The answer region is the text after the last ``</think>``; a ``<think>`` that is never closed scores 0
   (the model ran out of tokens while thinking), and an answer only inside ``<think>…</think>`` does not count.
2. The answer is the content of the last complete ``\\boxed{…}`` (braces balanced) in that region; no box, 0.
3. math-verify decides: ``verify(parse("$" + gold + "$"), parse("\\boxed{" + answer + "}"))``.

Time limit. math-verify's own timeouts use ``signal.alarm``, which only works on a process's main thread, and a
C-level big-integer operation is not interruptible by a signal at all. So :func:`verify` never calls math-verify
in the caller's process: a cheap bounded pre-filter rejects answers that are too long, too deeply nested or
exponent towers, and the rest is judged in a small pool of long-lived worker processes (``eval/_judge_worker.py``,
started on first use, one per concurrent caller up to :data:`MAX_WORKERS`). Inside a worker math-verify runs on
the worker's main thread with its own timeouts; the caller additionally waits at most ``timeout_s`` seconds
and kills and replaces a worker that overruns (or dies), scoring the sample 0. This works the same from the main
thread, from worker threads (verl's reward loop) and from daemon processes. Nothing in a model's output is ever
executed: the only interpretation is math-verify's LaTeX parser.
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

TIMEOUT_S = 5.0
"""Wall-clock limit per sample (parse + verify) before the sample scores 0."""
MAX_ANSWER_CHARS = 1000
"""Longer boxed answers score 0 without parsing (every benchmark gold is under 60 characters)."""
MAX_NESTING = 24
"""Deeper bracket nesting ({[( combined) scores 0 without parsing (the LaTeX parser recurses per level)."""
MAX_EXPONENT_DEPTH = 2
"""Exponent towers deeper than ``a^{b^{c}}`` score 0 without parsing."""
MAX_WORKERS = min(4, os.cpu_count() or 1)
"""Judge processes at most (callers beyond that wait for a free one)."""

_THINK_OPEN, _THINK_CLOSE, _BOX = "<think>", "</think>", "\\boxed"
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


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` whose braces balance (an unclosed trailing box is skipped)."""
    found = None
    start = text.find(_BOX)
    while start >= 0:
        brace = start + len(_BOX)
        while brace < len(text) and text[brace] == " ":
            brace += 1
        if brace < len(text) and text[brace] == "{":
            depth = 0
            for end in range(brace, len(text)):
                if text[end] == "{" and text[end - 1] != "\\":
                    depth += 1
                elif text[end] == "}" and text[end - 1] != "\\":
                    depth -= 1
                    if depth == 0:
                        found = text[brace + 1:end]
                        break
            else:
                break  # unclosed: no complete box can start after this one either
        start = text.find(_BOX, brace)
    return found


def extract_answer(solution_str: str) -> str | None:
    """The answer :func:`verify` judges (stripped boxed content), or None when there is none."""
    region = answer_region(solution_str)
    if region is None:
        return None
    boxed = last_boxed(region)
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

    Never raises for any model output and returns within about ``timeout_s`` seconds; safe from any thread.
    """
    answer = extract_answer(solution_str)
    if not answer or too_complex(answer):
        return 0.0
    return 1.0 if _POOL.judge(answer, ground_truth, timeout_s) else 0.0


class _JudgeWorker:
    """One ``_judge_worker.py`` process: a JSON line in (answer, gold, timeout), ``1``/``0`` out."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-u", str(_WORKER_SCRIPT)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        bufsize=1)
        self.ready = False

    def judge(self, answer: str, gold: str, timeout_s: float) -> bool | None:
        """The verdict, or None when the worker overran ``timeout_s`` or died (the caller then discards it)."""
        # The first request also waits for the worker's math-verify import, which does not count as judging.
        budget = timeout_s + (0.0 if self.ready else 60.0)
        # math-verify's own per-call timeout (parse gold, parse answer, verify) fires first in the usual case,
        # so a slow sample costs no worker restart; the wall limit below catches what a signal cannot interrupt.
        request = {"answer": answer, "gold": gold, "timeout": max(1, int(timeout_s / 2))}
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        deadline = time.monotonic() + budget
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([self.process.stdout], [], [], remaining)
            if readable:
                line = self.process.stdout.readline()
                if not line:
                    return None
                self.ready = True
                return line.strip() == "1"

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
    """Up to ``size`` idle-or-busy workers shared by every thread; a worker that overruns is killed and replaced."""

    def __init__(self, size: int):
        self._size = size
        self._pid = os.getpid()
        self._idle: queue.SimpleQueue[_JudgeWorker] = queue.SimpleQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._all: set[_JudgeWorker] = set()
        self._lock = threading.Lock()

    def judge(self, answer: str, gold: str, timeout_s: float) -> bool:
        if os.getpid() != self._pid:  # a forked child must not share its parent's worker pipes
            self.__init__(self._size)
        with self._slots:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                worker = _JudgeWorker()
                with self._lock:
                    self._all.add(worker)
            verdict = worker.judge(answer, gold, timeout_s)
            if verdict is None:
                self._discard(worker)
                return False
            self._idle.put(worker)
            return verdict

    def _discard(self, worker: _JudgeWorker) -> None:
        worker.close()
        with self._lock:
            self._all.discard(worker)

    def close(self) -> None:
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.close()


_POOL = _JudgePool(MAX_WORKERS)
atexit.register(_POOL.close)
