"""Each script carries its own requirements (PEP 723 inline metadata), so that a copy runs with `uv run SCRIPT.py`:
the block says what requirements.txt says, line for line, and it resolves on every Python the scripts accept."""

import atexit
import os
import re
import subprocess
import sys
import threading
import time

import conftest
import pytest
from conftest import ROOT, UV

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

SCRIPTS = ["ppo_procgen", "ppg_procgen", "ppo_procgen_full", "ppg_procgen_full"]
# PEP 723's reference regular expression for a metadata block
BLOCK = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")


def metadata(script, text=None):
    """The script's `script` metadata block, parsed as TOML (the one block of that type, as PEP 723 requires)."""
    blocks = [m for m in BLOCK.finditer(text or (ROOT / f"{script}.py").read_text()) if m["type"] == "script"]
    assert len(blocks) == 1, f"{script}.py has {len(blocks)} script metadata blocks"
    content = "".join(line[2:] if line.startswith("# ") else line[1:] for line in blocks[0]["content"].splitlines(True))
    return tomllib.loads(content)


def requirements(text=None):
    """requirements.txt's requirement lines, comments and blank lines left out."""
    lines = (text or (ROOT / "requirements.txt").read_text()).splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_inline_metadata_is_requirements_txt(script):
    meta = metadata(script)
    assert meta["dependencies"] == requirements(), f"{script}.py's dependencies differ from requirements.txt"
    # requires-python says what the Python gate, (3, A) <= version <= (3, B), says: the full files' plumbing's, which
    # they import first (the lean files have none)
    gate = re.search(r"\(3, (\d+)\) <= sys\.version_info\[:2\] <= \(3, (\d+)\)", (ROOT / "plumbing.py").read_text())
    assert gate, "plumbing.py has no Python gate"
    assert meta["requires-python"] == f">=3.{gate[1]},<3.{int(gate[2]) + 1}"


def test_the_full_files_carry_their_lean_files_block():
    for lean in ("ppo_procgen", "ppg_procgen"):
        assert metadata(f"{lean}_full") == metadata(lean)


def test_a_changed_requirement_or_marker_is_found():
    """The comparison above can fail: one marker changed on either side is a difference."""
    text, script = (ROOT / "requirements.txt").read_text(), (ROOT / "ppo_procgen.py").read_text()
    assert requirements() == metadata("ppo_procgen")["dependencies"]
    assert requirements(text.replace('< "3.11"', '<= "3.11"', 1)) != metadata("ppo_procgen")["dependencies"]
    assert requirements() != metadata("ppo_procgen", script.replace('< "3.13"', '< "3.14"', 1))["dependencies"]


def supported_minors():
    """The minor versions of the Pythons that the block's requires-python accepts."""
    low, high = (
        int(v) for v in re.fullmatch(r">=3\.(\d+),<3\.(\d+)", metadata("ppo_procgen")["requires-python"]).groups()
    )
    return range(low, high)


def start_early(folder):
    """uv's resolutions, one for each supported Python, started as the session starts (conftest: they wait on the
    package index, not on the CPU): each writes its packages to `3.N.txt` in `folder`, its errors to `3.N.err` and,
    when it ends, its exit status to `3.N.status`."""
    if UV is None:
        return
    (folder / "requirements.in").write_text("\n".join(metadata("ppo_procgen")["dependencies"]) + "\n")
    for minor in supported_minors():
        platform = ["--python-version", f"3.{minor}", "--python-platform", "x86_64-manylinux_2_28"]
        cmd = [UV, "pip", "compile", "--no-config", "--quiet", *platform, str(folder / "requirements.in")]
        with open(folder / f"3.{minor}.err", "w") as err:
            proc = subprocess.Popen([*cmd, "-o", str(folder / f"3.{minor}.txt")], stdout=err, stderr=err)
        atexit.register(proc.kill)  # one still going when the run ends goes with it

        def done(proc=proc, minor=minor):  # the status last, and whole: a reader sees it only when all is written
            (folder / f"3.{minor}.tmp").write_text(str(proc.wait()))
            os.replace(folder / f"3.{minor}.tmp", folder / f"3.{minor}.status")

        threading.Thread(target=done, daemon=True).start()


@pytest.mark.skipif(UV is None, reason="uv is not installed")
def test_the_block_resolves_on_every_supported_python():
    """uv resolves the block's dependencies against the package index for each Python the gate accepts, on Linux
    x86-64, installing nothing: a marker that picks no procgen package, or two, or an unsatisfiable pin fails here."""
    folder, deadline = conftest.early_work(sys.modules[__name__]), time.time() + 240
    for minor in supported_minors():
        status = folder / f"3.{minor}.status"
        while not status.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert status.exists(), f"Python 3.{minor}: uv still resolving after 240 s"
        assert status.read_text() == "0", f"Python 3.{minor}: {(folder / f'3.{minor}.err').read_text()[-2000:]}"
        names = {line.split("==")[0] for line in (folder / f"3.{minor}.txt").read_text().splitlines() if "==" in line}
        procgens = names & {"procgen", "procgen-mirror", "procgen-gym"}
        assert len(procgens) == 1, f"Python 3.{minor} resolves {sorted(procgens)}"
        assert {"torch", "gymnasium", "tyro", "tensorboard", "numpy"} <= names, f"Python 3.{minor}: {sorted(names)}"
