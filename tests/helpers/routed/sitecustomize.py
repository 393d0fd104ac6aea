"""Imported at the start of every Python process of a routed run (conftest.routed puts this folder on PYTHONPATH): the
`python FILE.py ARGS` (and `-m MODULE`, `-c CODE`) commands that the process starts go through the fork server whose
socket TESTS_FORK_SERVER names, and the file that TESTS_AT_START names runs first (a fault that a test plants in a
benchmark's processes). The fork server runs `at_start` again in each process it forks, once the process has its argv
and environment."""

import os
import subprocess
import sys

PREFORK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "prefork.py")


def at_start():
    if os.environ.get("TESTS_AT_START"):
        with open(os.environ["TESTS_AT_START"]) as f:
            exec(compile(f.read(), os.environ["TESTS_AT_START"], "exec"), {"__name__": "at_start"})


def through_the_fork_server(popen_init):
    def init(self, args, *rest, **kwargs):
        env, command = kwargs.get("env") or os.environ, list(args) if isinstance(args, (list, tuple)) else []
        if command[:2] == [sys.executable, "-u"] and env.get("PYTHONUNBUFFERED"):  # torchrun's workers, unbuffered
            del command[1]  # as the server is
        first = str(command[1]) if len(command) > 1 and command[0] == sys.executable else ""
        # `python FILE.py ...`, `python -m MODULE ...` (the GPU kit's pytest), `python -c CODE` (its check of procgen)
        if env.get("TESTS_FORK_SERVER") and (first.endswith(".py") or first in ("-m", "-c") and len(command) > 2):
            args = [sys.executable, "-S", PREFORK, env["TESTS_FORK_SERVER"], *command[1:]]
        popen_init(self, args, *rest, **kwargs)

    return init


subprocess.Popen.__init__ = through_the_fork_server(subprocess.Popen.__init__)
at_start()
