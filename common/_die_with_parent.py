"""``python -S _die_with_parent.py <parent pid> <signal> <command...>``: runs the command so that it gets ``signal``
when process ``<parent pid>`` dies (``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``), or at once if that parent is
already gone. ``common.processes.start_in_new_session`` starts every child through it instead of setting the signal
in a ``preexec_fn``: Python code between ``fork`` and ``exec`` in a process with threads (the orchestrator starts
stages from a thread pool, with threads copying their output) can deadlock on a lock another thread held at the fork.
Standard library only, and run without ``site``, so it adds milliseconds to a start."""
import ctypes
import os
import sys

PR_SET_PDEATHSIG = 1

parent, sig, command = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
if os.getppid() != parent:  # the parent died before the call: the kernel will not send the signal for it
    os.kill(os.getpid(), sig)
os.execvp(command[0], command)
