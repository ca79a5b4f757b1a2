"""The report: the floor above the stages (docs/architecture.md). ``run`` is the report stage
(``python -m report.run``): Tables 1 and 2 (``tables``), pass@k curves and heatmaps (``plots``), sweeps
(``sweep``), the paper's other analyses (``analyses``), and ``bfcl``, the tool-use appendix tables. It reads the runs
the experiment's config names (``common.paths``) and uses the evaluation's statistics (``eval.metrics``,
``eval.intervals``, ``eval.bfcl.checker``)."""
