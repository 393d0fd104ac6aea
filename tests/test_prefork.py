"""The tests' fork server (tests/prefork.py): a file run through it sees what `python FILE ARGS` would show it, and its
process ends as that one would."""

import json
import os
import signal
import subprocess

import pytest
from conftest import python

PROBE = """import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("PROBE"), "path0": sys.path[0],
                  "name": __name__, "torch": "torch" in sys.modules}))
sys.stderr.write("to stderr\\n")
code = int(sys.argv[1])
if code < 0:
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


@pytest.mark.skipif(os.environ.get("TESTS_NO_PREFORK") == "1", reason="TESTS_NO_PREFORK=1: python itself")
def test_a_file_run_through_the_fork_server_sees_what_python_would_show_it(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    assert python()[1] == "-S", "the fork server did not start"
    # after the server started, as the first train() in a worker does: set inductor's cache directory in os.environ
    import torch._dynamo  # noqa: F401

    for code, env, preloaded in ((0, {}, True), (3, {}, True), (-signal.SIGTERM, {}, True),
                                 (0, {"OMP_NUM_THREADS": "7"}, False)):  # fmt: skip
        cmd = [*python(), "probe.py", str(code)]
        proc = subprocess.run(
            cmd, cwd=tmp_path, env={**os.environ, "PROBE": "x", **env}, capture_output=True, text=True
        )
        assert proc.returncode == code and proc.stderr == "to stderr\n", (code, proc.stderr)
        seen = json.loads(proc.stdout)
        assert seen == {"argv": ["probe.py", str(code)], "cwd": str(tmp_path), "env": "x",
                        "path0": str(tmp_path), "name": "__main__", "torch": preloaded}, seen  # fmt: skip
