"""The two tiers cannot drift apart: the lean and the full script log the same numbers, and differ only by additions."""

import subprocess

import pytest
import tyro
from conftest import ROOT, load_script, read_scalars, smoke_args

# lean file -> its full file, and the pairs whose diff must stay small: (old, new)
TIERS = {"ppo_procgen": "ppo_procgen_full", "ppg_procgen": "ppg_procgen_full"}
DIFFS = [("ppo_procgen", "ppo_procgen_full"), ("ppg_procgen", "ppg_procgen_full"), ("ppo_procgen", "ppg_procgen")]
MAX_CHANGED = 40  # lines of the first file that the second removes or changes


def changed_lines(old, new):
    diff = subprocess.run(["diff", str(ROOT / f"{old}.py"), str(ROOT / f"{new}.py")], capture_output=True, text=True)
    return [line for line in diff.stdout.splitlines() if line.startswith("<")]


@pytest.mark.parametrize("old,new", DIFFS)
def test_the_second_file_keeps_the_first_files_lines(old, new):
    removed = changed_lines(old, new)
    assert len(removed) <= MAX_CHANGED, f"{new}.py removes or changes {len(removed)} lines of {old}.py:\n" + "\n".join(
        removed
    )


@pytest.mark.parametrize("lean", TIERS)
def test_lean_and_full_log_bit_identical_numbers(tmp_path, monkeypatch, lean):
    """One seed, the default flags at smoke size, on CPU: every logged loss, return and test return is equal, PPG's
    auxiliary phase included."""
    logged = {}
    for name in (lean, TIERS[lean]):
        monkeypatch.chdir(tmp_path)
        script = load_script(name)
        args = tyro.cli(script.Args, args=[*smoke_args(lean), "--device", "cpu", "--exp-name", "parity"])
        run_name = script.train(args)
        scalars = read_scalars(tmp_path / "runs" / run_name)
        logged[name] = {
            tag: values
            for tag, values in scalars.items()
            if tag.startswith(("losses/", "charts/episodic", "charts/test"))
        }
        for path in (tmp_path / "runs").iterdir():  # the next script's run gets a directory of its own
            path.rename(tmp_path / f"done_{name}_{path.name}")
    lean_logs, full_logs = logged[lean], logged[TIERS[lean]]
    assert lean_logs["losses/policy_loss"] and lean_logs.get("charts/episodic_return")
    if lean == "ppg_procgen":
        assert lean_logs["losses/aux/kl_loss"]
    assert lean_logs == full_logs
