"""The two tiers cannot drift apart: the lean and the full script log the same numbers, and differ only by additions."""

import difflib
import re
import subprocess

import pytest
import tyro
from conftest import ROOT, load_script, read_scalars, smoke_args

# lean file -> its full file, and the pairs whose diff must stay small: (old, new)
TIERS = {"ppo_procgen": "ppo_procgen_full", "ppg_procgen": "ppg_procgen_full"}
DIFFS = [("ppo_procgen", "ppo_procgen_full"), ("ppg_procgen", "ppg_procgen_full"), ("ppo_procgen", "ppg_procgen")]
MAX_CHANGED = 53  # lines of the first file that the second removes or changes (40 before the lean files said what
# the algorithm does: the full files now pay for V-trace's per-epoch advantages, resume's counters and their signals;
# 48 before the folded and pipelined rollouts: the policy step, its noise argument and the test loop's condition; the
# full PPO file is at 52 since an episode's two scalars became one event, 53 since a failed model write ends the run
# with status 4 at its end rather than exiting at once, 54 with reward normalisation's own discount, 53 since
# the value loss is the lean file's plain mean again: the importance weights reach the policy loss alone)
MAX_CHANGED_PPG = 63  # the full PPG file's 10 more: 5 since the loop became three stages (the policy stage's noise
# (2), the update stage's prioritised weights (3 lines, where the loop had 2), the learning rate set in place and the
# compiled auxiliary stage's call, less the Ctrl-C line that the lean files now share), --cnn-channels passed to
# both of `dual`'s networks (2), the auxiliary minibatch gathered as rows of bytes (`take`, 1), and an episode's two
# scalars written as one event (2); 63 with the failed model write, 64 with
# reward normalisation's own discount, 63 with the value loss's plain mean (as in PPO's; 62 by the fenced blocks' count)


def changed_lines(old, new):
    diff = subprocess.run(["diff", str(ROOT / f"{old}.py"), str(ROOT / f"{new}.py")], capture_output=True, text=True)
    return [line for line in diff.stdout.splitlines() if line.startswith("<")]


@pytest.mark.parametrize("old,new", DIFFS)
def test_the_second_file_keeps_the_first_files_lines(old, new):
    removed, limit = changed_lines(old, new), MAX_CHANGED_PPG if new == "ppg_procgen_full" else MAX_CHANGED
    assert len(removed) <= limit, f"{new}.py removes or changes {len(removed)} lines of {old}.py:\n" + "\n".join(
        removed
    )


OPENER = re.compile(r"^(\s*)# ── (?!end )(.+?) ──")  # `# ── name ──`, a comment line of its own
ENDER = re.compile(r"^(\s*)# ── end (.+?) ──$")  # `# ── end name ──`, at the opener's indentation
MAX_ADDED = 152  # non-blank lines outside the blocks that a full file adds: the other side of its changed lines, the
# features' imports, and one-line additions, each marked with the [N] of its feature (136 in PPO, 152 in PPG; 3 of
# them since a run that could not write its last checkpoint or model file, or lost its directory, says so: the
# imports of errno and threading, and the model write's failure; 1 the reward normaliser's discount; 1
# each minibatch's V-trace part, as Metta's loss takes it)


def fenced_blocks(lines):
    """(first, last, title) of every fenced block, ends included; an opener left open, an end without an opener, a
    block inside a block, or a marker on a line of code fails."""
    blocks, start = [], None
    for i, line in enumerate(lines, 1):
        opener, end = OPENER.match(line), ENDER.match(line)
        assert opener or end or "──" not in line, f"line {i}: a marker that neither opens nor ends a block: {line}"
        if opener:
            assert start is None, f"line {i}: a block opens inside the one opened at line {start}"
            start = i
        elif end:
            assert start is not None, f"line {i}: a block ends that was not opened"
            indent, title = OPENER.match(lines[start - 1]).groups()
            assert end[1] == indent and end[2] in title, f"line {i}: `{end[2]}` ends `{title}` (line {start})"
            blocks.append((start, i, title))
            start = None
    assert start is None, f"line {start}: a block that never ends"
    return blocks


@pytest.mark.parametrize("lean", TIERS)
def test_the_full_file_is_the_lean_file_and_its_fenced_blocks(lean):
    """Every feature block is delimited at both ends; taking them out leaves the lean file, give or take the lines
    that the diff test allows to change and a few one-line additions."""
    full = (ROOT / f"{TIERS[lean]}.py").read_text().splitlines()
    blocks = fenced_blocks(full)
    inside = {i for first, last, _ in blocks for i in range(first, last + 1)}
    rest = [line for i, line in enumerate(full, 1) if i not in inside and line.strip()]  # blank lines are layout
    lean_lines = [line for line in (ROOT / f"{lean}.py").read_text().splitlines() if line.strip()]
    diff = list(difflib.unified_diff(lean_lines, rest, lineterm="", n=0))
    removed = [line for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
    print("\n".join(f"{TIERS[lean]}.py:{first}-{last}  {title}" for first, last, title in blocks))
    assert len(blocks) > 10
    assert len(removed) <= (MAX_CHANGED_PPG if lean == "ppg_procgen" else MAX_CHANGED), "\n".join(removed)
    assert len(added) <= MAX_ADDED, f"{len(added)} lines added outside the blocks:\n" + "\n".join(added)


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
