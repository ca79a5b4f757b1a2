import os
import sys

print("note: `python -m eval.report` is now `python -m report.run`; this alias goes in the next release",
      file=sys.stderr, flush=True)
os.execv(sys.executable, [sys.executable, "-m", "report.run", *sys.argv[1:]])
