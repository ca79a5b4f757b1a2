"""``python -m eval.report`` is now ``python -m report.run`` (the report is its own package above the stages,
docs/architecture.md); ``__main__`` forwards the command line there, for one release."""
