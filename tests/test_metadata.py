"""Each script carries its own requirements (PEP 723 inline metadata), so that a copy runs with `uv run SCRIPT.py`:
the block says what requirements.txt says, line for line, and it resolves on every Python the scripts accept."""

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

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


# uv, on the PATH or beside this Python (a virtual environment not activated)
UV = shutil.which("uv") or shutil.which("uv", path=os.path.dirname(sys.executable))


@pytest.mark.skipif(UV is None, reason="uv is not installed")
def test_the_block_resolves_on_every_supported_python(tmp_path):
    """uv resolves the block's dependencies against the package index for each Python the gate accepts, on Linux
    x86-64, installing nothing: a marker that picks no procgen package, or two, or an unsatisfiable pin fails here."""
    meta = metadata("ppo_procgen")
    low, high = (int(v) for v in re.fullmatch(r">=3\.(\d+),<3\.(\d+)", meta["requires-python"]).groups())
    (tmp_path / "requirements.in").write_text("\n".join(meta["dependencies"]) + "\n")

    def resolve(minor):
        out = tmp_path / f"3.{minor}.txt"
        platform = ["--python-version", f"3.{minor}", "--python-platform", "x86_64-manylinux_2_28"]
        cmd = [UV, "pip", "compile", "--no-config", "--quiet", *platform, str(tmp_path / "requirements.in")]
        cmd += ["-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, f"Python 3.{minor}: {proc.stderr[-2000:]}"
        return minor, {line.split("==")[0] for line in out.read_text().splitlines() if "==" in line}

    with concurrent.futures.ThreadPoolExecutor(high - low) as pool:
        resolved = dict(pool.map(resolve, range(low, high)))
    for minor, names in resolved.items():
        procgens = names & {"procgen", "procgen-mirror", "procgen-gym"}
        assert len(procgens) == 1, f"Python 3.{minor} resolves {sorted(procgens)}"
        assert {"torch", "gymnasium", "tyro", "tensorboard", "numpy"} <= names, f"Python 3.{minor}: {sorted(names)}"
