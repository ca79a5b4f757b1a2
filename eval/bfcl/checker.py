"""BFCL scoring: BFCL's own decoder and AST checker (``bfcl-eval``, in its own venv) and BFCL's accuracy definitions.

``bfcl-eval`` pins ``numpy==1.26.4`` and a dozen vendor SDKs, and its AST checker cannot be imported without them
(``ast_checker`` imports the model registry, which imports every handler; docs/tool_use.md has the measurements), so
it runs in an isolated venv (``make bfcl-env``: ``requirements/bfcl.txt`` into ``.venv-bfcl``) as a subprocess,
``eval/bfcl/_worker.py``, which decides each output exactly as ``bfcl_eval.eval_checker.eval_runner`` does.

Categories (BFCL v4 file names, ``BFCL_v4_<category>.json``): the four *live* AST categories
:data:`LIVE_CATEGORIES` and the irrelevance sets ``live_irrelevance`` (884) and ``irrelevance`` (v1, 240).

Accuracy, as BFCL's ``eval_runner_helper`` defines it::

    acc(c)       = correct(c) / total(c)                                   one category
    live overall = Σ_c acc(c) · total(c) / Σ_c total(c)      c over LIVE_CATEGORIES (calculate_weighted_accuracy)
                 = Σ_c correct(c) / Σ_c total(c)
    irrelevance  = acc(irrelevance category): the share of outputs from which no function call decodes
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from common.config.data import LIVE_CATEGORIES

DEFAULT_IRRELEVANCE = "live_irrelevance"
"""The set this project reports as "Irrelevance Detection" (the paper does not say which; docs/tool_use.md)."""
BFCL_EVAL_VERSION = "2026.3.23"
"""The ``bfcl-eval`` release whose data and checker are scored against (``requirements/bfcl.txt``)."""
DEFAULT_REGISTRY_NAME = "Qwen/Qwen3-8B-FC"
"""BFCL's registry entry whose handler (``QwenFCHandler``: ``<tool_call>`` JSON blocks) decodes the outputs; the
checker reads only its ``underscore_to_dot`` flag (False for every local Qwen3 FC entry)."""
BFCL_PYTHON_ENV = "BFCL_PYTHON"
"""Environment variable naming the BFCL venv's interpreter (default: :data:`DEFAULT_BFCL_PYTHON`)."""
DEFAULT_BFCL_PYTHON = Path(__file__).resolve().parents[2] / ".venv-bfcl" / "bin" / "python"
_WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
STARTUP_TIMEOUT_S = 900.0
"""Time the worker may take to import bfcl_eval (its handler registry imports every vendor SDK)."""
REQUEST_TIMEOUT_S = 120.0


class BfclUnavailableError(RuntimeError):
    """No BFCL venv interpreter at the configured path (build it with ``make bfcl-env``)."""


def bfcl_python() -> Path:
    """The BFCL venv's interpreter: ``$BFCL_PYTHON`` or ``.venv-bfcl/bin/python`` in the repository."""
    return Path(os.environ.get(BFCL_PYTHON_ENV) or DEFAULT_BFCL_PYTHON)


@dataclass(frozen=True)
class Verdict:
    """BFCL's decision on one output."""

    valid: bool
    error_type: str | None = None
    """BFCL's error type, e.g. ``ast_decoder:decoder_failed``, ``simple_function_checker:value_error``,
    ``irrelevance_error:decoder_success``; None when valid."""


class BfclChecker:
    """One ``_worker.py`` process in the BFCL venv; :meth:`check` sends one output and returns BFCL's verdict."""

    def __init__(self, python: Path | None = None, registry_name: str = DEFAULT_REGISTRY_NAME):
        python = python or bfcl_python()
        if not python.exists():
            raise BfclUnavailableError(f"no BFCL checker interpreter at {python}: run `make bfcl-env` "
                                       f"(or set {BFCL_PYTHON_ENV} to a venv with bfcl-eval=={BFCL_EVAL_VERSION})")
        self.process = subprocess.Popen([str(python), "-u", str(_WORKER_SCRIPT), "--registry-name", registry_name],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, bufsize=1)
        ready = self._read(STARTUP_TIMEOUT_S)
        if not ready or not ready.get("ready"):
            stderr = self._stderr_tail()
            self.close()
            raise RuntimeError(f"the BFCL checker {_WORKER_SCRIPT} under {python} did not start: {stderr}")
        self.bfcl_eval_version: str = ready["bfcl_eval_version"]

    def _read(self, timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.process.stdout], [], [], remaining)
            if readable:
                line = self.process.stdout.readline()
                return json.loads(line) if line else None
        return None

    def _stderr_tail(self) -> str:
        if self.process.poll() is None:
            self.process.kill()
        return (self.process.stderr.read() or "")[-2000:]

    def _ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = self._read(REQUEST_TIMEOUT_S)
        if reply is None:
            raise RuntimeError(f"the BFCL checker gave no answer to {dict(request)!r}: {self._stderr_tail()}")
        if "failure" in reply:
            raise RuntimeError(f"the BFCL checker failed on {dict(request)!r}: {reply['failure']}")
        return reply

    def check(self, category: str, entry_id: str, output: str, *, function: Sequence[Mapping] | None = None,
              ground_truth: Sequence[Mapping] | None = None) -> Verdict:
        """BFCL's verdict on ``output`` (raw completion text) for entry ``entry_id`` of ``category``.

        ``function`` (BFCL function documents) and ``ground_truth`` (BFCL possible answers,
        ``[{name: {param: [accepted values]}}]``) check an entry that is not in BFCL's files.
        """
        request: dict[str, Any] = {"op": "check", "category": category, "id": entry_id, "output": output}
        if function is not None:
            request["function"] = list(function)
        if ground_truth is not None:
            request["ground_truth"] = list(ground_truth)
        reply = self._ask(request)
        return Verdict(valid=reply["valid"], error_type=reply["error_type"])

    def entries(self, category: str) -> list[dict[str, Any]]:
        """BFCL's entries of ``category`` as its generation step loads them (``id``, ``question``, ``function``)."""
        return self._ask({"op": "entries", "category": category})["entries"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            stream.close()

    def __enter__(self) -> "BfclChecker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prompt_of(entry: Mapping[str, Any]) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """A single-turn BFCL entry as ``(messages, tools)`` for ``apply_chat_template(messages, tools=tools,
    add_generation_prompt=True)``: the first turn's messages and the function documents unwrapped, with BFCL's own
    type names, as BFCL's ``QwenFCHandler._format_prompt`` writes them (one ``json.dumps(f)`` line each in ``<tools>``;
    Qwen3's template writes ``tool | tojson``)."""
    turns = entry["question"]
    if len(turns) != 1:
        raise ValueError(f"BFCL entry {entry.get('id')!r} has {len(turns)} turns; only single-turn entries are scored")
    return [{"role": m["role"], "content": m["content"]} for m in turns[0]], [dict(f) for f in entry["function"]]


def prompt_ids(tokenizer: Any, entry: Mapping[str, Any]) -> list[int]:
    """The generation prompt's token ids of a BFCL entry: ``tokenizer.apply_chat_template`` over :func:`prompt_of`."""
    messages, tools = prompt_of(entry)
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


@dataclass(frozen=True)
class CategoryScore:
    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else float("nan")


def category_scores(results: Iterable[tuple[str, bool]]) -> dict[str, CategoryScore]:
    """``(category, valid)`` pairs → per-category correct and total counts."""
    counts: dict[str, list[int]] = {}
    for category, valid in results:
        tally = counts.setdefault(category, [0, 0])
        tally[0] += int(valid)
        tally[1] += 1
    return {category: CategoryScore(correct, total) for category, (correct, total) in counts.items()}


def live_overall(scores: Mapping[str, CategoryScore]) -> CategoryScore:
    """BFCL's live overall accuracy: count-weighted over :data:`LIVE_CATEGORIES` (the ones present)."""
    present = [scores[c] for c in LIVE_CATEGORIES if c in scores]
    return CategoryScore(sum(s.correct for s in present), sum(s.total for s in present))


def summary(scores: Mapping[str, CategoryScore], irrelevance: str = DEFAULT_IRRELEVANCE) -> dict[str, Any]:
    """The two columns of the paper's appendix tables plus every category: accuracies in percent and counts."""
    overall = live_overall(scores)
    table = {"bfcl_live": 100 * overall.accuracy, "bfcl_live_total": overall.total}
    if irrelevance in scores:
        table.update(irrelevance_detection=100 * scores[irrelevance].accuracy, irrelevance_set=irrelevance,
                     irrelevance_total=scores[irrelevance].total)
    table["categories"] = {c: {"accuracy": 100 * s.accuracy, "correct": s.correct, "total": s.total}
                           for c, s in sorted(scores.items())}
    return table
