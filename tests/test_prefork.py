"""The tests' fork server (tests/helpers/prefork.py): a file run through it sees what `python FILE ARGS` would show
it, and its process ends as that one would."""

import json
import os
import signal
import subprocess
import sys

from conftest import fork_server

PROBE = """import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("PROBE"), "path0": sys.path[0],
                  "name": __name__, "torch": "torch" in sys.modules}))
sys.stderr.write("to stderr\\n")
code = int(sys.argv[1])
if code < 0:
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def test_a_file_run_through_the_fork_server_sees_what_python_would_show_it(tmp_path):
    """Exit statuses and signals pass through; a variable read at import time that differs sends the file to python
    itself, but not one that the imports set themselves (inductor's cache directory, which a worker's environment
    lacks until its first train() and holds after it)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    (tmp_path / "probe.py").write_text(PROBE)
    base = {key: value for key, value in os.environ.items() if key != "TORCHINDUCTOR_CACHE_DIR"}
    command = fork_server(base)
    assert command is not None, "the fork server did not start"
    for code, env, preloaded in ((0, {}, True), (3, {}, True), (-signal.SIGTERM, {}, True),
                                 (0, {"TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}, True),
                                 (0, {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}, False),
                                 (0, {"OMP_NUM_THREADS": "7"}, False)):  # fmt: skip
        proc = subprocess.run([*command, "probe.py", str(code)], cwd=tmp_path, env={**base, "PROBE": "x", **env},
                              capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == code and proc.stderr == "to stderr\n", (code, env, proc.stderr)
        seen = json.loads(proc.stdout)
        assert seen == {"argv": ["probe.py", str(code)], "cwd": str(tmp_path), "env": "x",
                        "path0": str(tmp_path), "name": "__main__", "torch": preloaded}, (env, seen)  # fmt: skip
    # a stream closed at the start (`>&-`, as some schedulers start jobs) is closed in the run too, as Python starts
    # then: the stream None, its descriptor the next one a file opens
    (tmp_path / "closed.py").write_text(
        "import os, sys\nsys.stderr.write(f'{sys.stdout} {os.open(os.devnull, 0)} {\"torch\" in sys.modules}')"
    )
    proc = subprocess.run([*command, "closed.py"], cwd=tmp_path, env=base, stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: os.close(1))  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "None 1 True", proc.stderr  # run by the server
    # `python -m MODULE` and `python -c CODE` (the GPU kit starts its pytest and its check of procgen so): what a
    # fresh Python shows them, the preloaded modules aside
    for how in (["-m", "probe"], ["-c", PROBE]):
        procs = [subprocess.run([*python, *how, "3"], cwd=tmp_path, env={**base, "PROBE": "x"}, capture_output=True,
                                text=True) for python in (command, [sys.executable])]  # fmt: skip
        assert [p.returncode for p in procs] == [3, 3] and procs[0].stderr == procs[1].stderr, procs
        assert json.loads(procs[0].stdout) == {**json.loads(procs[1].stdout), "torch": True}, procs
