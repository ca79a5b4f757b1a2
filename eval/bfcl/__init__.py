"""The evaluation stage's BFCL family (docs/tool_use.md): ``checker`` (BFCL's own decoder and AST checker in its venv,
and BFCL's accuracy definitions), ``evaluate`` (the family's run folders, entered from ``python -m eval.run`` when
``data.benchmark_source=bfcl``) and ``_worker`` (the checker process, run in the BFCL venv)."""
