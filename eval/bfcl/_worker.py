"""BFCL checker process for ``eval.bfcl.checker``: runs in the isolated BFCL venv (``requirements/bfcl.txt``), never
in ours.

    <bfcl-venv>/bin/python eval/bfcl/_worker.py --registry-name Qwen/Qwen3-8B-FC

Imports only the standard library and ``bfcl_eval``, whose pinned dependencies (``numpy==1.26.4``, vendor SDKs) clash
with the project's stack. Writes one JSON line ``{"ready": true, "bfcl_eval_version": ...}`` once BFCL is imported,
then answers JSON lines until its stdin closes:

``{"op": "check", "category": c, "id": i, "output": text}`` (optionally with ``"function"`` and ``"ground_truth"``
to check an entry that is not in BFCL's files, e.g. the project's synthetic set) → ``{"valid": bool,
"error_type": str | null, "error": [...]}``, decided exactly as ``bfcl_eval.eval_checker.eval_runner`` decides it:

* AST categories (``live_simple``, ``live_multiple``, ``live_parallel``, ``live_parallel_multiple``, ...): the
  output is decoded by BFCL's ``QwenFCHandler.decode_ast`` (``<tool_call>\\n{json}\\n</tool_call>`` blocks) and
  checked by ``_evaluate_single_ast_entry`` (format check, then ``ast_checker`` against the possible answers);
* ``irrelevance`` / ``live_irrelevance``: ``_evaluate_single_relevance_entry``: valid iff no function call decodes.

As in BFCL's own generation step, text up to the last ``</think>`` is reasoning and is dropped before decoding.

``{"op": "entries", "category": c}`` → ``{"entries": [...]}``: BFCL's ``load_dataset_entry(c)`` (the questions and
function documents as BFCL's generation step sees them); ``{"op": "ids", "category": c}`` → ``{"ids": [...]}``.
"""
from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version

THINK_END = "</think>"


def _final_response(text: str) -> str:
    """What BFCL's Qwen handler keeps of a completion: the text after the last ``</think>``, newlines stripped left."""
    return text.split(THINK_END)[-1].lstrip("\n") if THINK_END in text else text


class Checker:
    def __init__(self, registry_name: str):
        from bfcl_eval.constants.enums import Language, ReturnFormat
        from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING
        from bfcl_eval.eval_checker import eval_runner
        from bfcl_eval.utils import is_relevance_or_irrelevance, load_dataset_entry, load_ground_truth_entry

        config = MODEL_CONFIG_MAPPING[registry_name]
        self._handler = config.model_handler(model_name=config.model_name, temperature=0.0,
                                             registry_name=registry_name, is_fc_model=config.is_fc_model)
        self._model_name = registry_name.replace("/", "_")
        self._language, self._format = Language.PYTHON, ReturnFormat.PYTHON
        self._runner = eval_runner
        self._is_relevance = is_relevance_or_irrelevance
        self._load_entries, self._load_answers = load_dataset_entry, load_ground_truth_entry
        self._entries: dict[str, dict[str, dict]] = {}
        self._answers: dict[str, dict[str, object]] = {}

    def entries(self, category: str) -> dict[str, dict]:
        if category not in self._entries:
            self._entries[category] = {e["id"]: e for e in self._load_entries(category)}
        return self._entries[category]

    def answers(self, category: str) -> dict[str, object]:
        if category not in self._answers:
            self._answers[category] = {e["id"]: e["ground_truth"] for e in self._load_answers(category)}
        return self._answers[category]

    def check(self, request: dict) -> dict:
        category, entry_id = request["category"], request["id"]
        output = _final_response(request["output"])
        if "function" in request:
            entry = {"id": entry_id, "function": request["function"]}
        else:
            entry = self.entries(category)[entry_id]
        if self._is_relevance(category):
            result = self._runner._evaluate_single_relevance_entry(self._handler, entry_id, output, entry,
                                                                   self._model_name, category)
        else:
            answer = request["ground_truth"] if "ground_truth" in request else self.answers(category)[entry_id]
            result = self._runner._evaluate_single_ast_entry(self._handler, entry_id, output, answer, entry,
                                                             self._model_name, category, language=self._language,
                                                             return_format=self._format)
        return {"valid": bool(result["valid"]), "error_type": result.get("error_type"),
                "error": [str(e) for e in result.get("error", [])]}

    def answer(self, request: dict) -> dict:
        op = request.get("op", "check")
        if op == "check":
            return self.check(request)
        if op == "entries":
            return {"entries": list(self.entries(request["category"]).values())}
        if op == "ids":
            return {"ids": list(self.entries(request["category"]))}
        raise ValueError(f"unknown op {op!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--registry-name", default="Qwen/Qwen3-8B-FC")
    args = parser.parse_args()
    checker = Checker(args.registry_name)
    sys.stdout.write(json.dumps({"ready": True, "bfcl_eval_version": version("bfcl-eval")}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            reply = checker.answer(json.loads(line))
        except Exception as error:  # reported to the caller, which raises it with the request that caused it
            reply = {"failure": f"{type(error).__name__}: {error}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
