"""Engine process of ``eval.sample.EnginePool``: one sampler (``eval.sample.make_engine``) on the GPUs of its
``CUDA_VISIBLE_DEVICES``.

Protocol, pickled on stdin / stdout: first ``(model_path, cfg, max_model_len)``, answered ``("ready", (backend,
version, settings))``; then ``(method, arguments)`` requests, ``method`` one of :data:`METHODS` of the sampler
(``("sample", (prompts, seeds, n))``, ``("prompt_logprobs", (prompts,))``), each answered ``("ok", result)``; any
failure is answered ``("error", traceback)``. Exits, closing its engine, when its stdin closes. The engine's own
prints go to stderr (file descriptor 1 is pointed there), so nothing but replies reaches the parent's pipe.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from typing import Any, BinaryIO

METHODS = ("sample", "prompt_logprobs")
"""The sampler methods a request may call."""


def reply(channel: BinaryIO, status: str, payload: Any) -> None:
    pickle.dump((status, payload), channel)
    channel.flush()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes or kills us
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    requests = sys.stdin.buffer
    from eval.sample import make_engine

    try:
        model_path, cfg, max_model_len = pickle.load(requests)
        sampler = make_engine(model_path, cfg, max_model_len)
    except Exception:
        reply(replies, "error", traceback.format_exc())
        return
    reply(replies, "ready", (sampler.backend, sampler.version, sampler.settings))
    while True:
        try:
            method, arguments = pickle.load(requests)
        except EOFError:
            break
        try:
            if method not in METHODS:
                raise ValueError(f"unknown engine request {method!r}; known: {METHODS}")
            reply(replies, "ok", getattr(sampler, method)(*arguments))
        except Exception:
            reply(replies, "error", traceback.format_exc())
    sampler.close()


if __name__ == "__main__":
    main()
