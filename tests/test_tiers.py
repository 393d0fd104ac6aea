"""The two tiers cannot drift apart: the lean and the full script log the same numbers, and differ only by additions."""

import ast
import difflib
import re
import subprocess

import pytest
import tyro
from conftest import ROOT, load_script, read_scalars, smoke_args
from test_metadata import BLOCK

# lean file -> its full file, and the pairs whose diff must stay small: (old, new)
TIERS = {"ppo_procgen": "ppo_procgen_full", "ppg_procgen": "ppg_procgen_full"}
DIFFS = [("ppo_procgen", "ppo_procgen_full"), ("ppg_procgen", "ppg_procgen_full"), ("ppo_procgen", "ppg_procgen")]
MAX_CHANGED = 69  # lines of the lean PPO file that the full one removes or changes: the docstring (3), what its
# features pass or wrap (the envs' threads and video directory, the agent's options, torchrun's shares and the test
# envs' draws of each process, V-trace, the prioritised minibatches by name, the compiled stages, the pinned copies),
# and where the plumbing module (plumbing.py) takes over: the run's name and directory, its event writer, the
# iteration's logging and console line (plumbing.Run.log: the lean file's 11 lines), the model write that fails in one
# line, the command line (tyro's errors in one line), and the imports these leave unused
MAX_CHANGED_PPG = 84  # the full PPG file's 15 more: its auxiliary phase run, logged and checkpointed from one place
# (`AuxiliaryPhase.close`, which a resume inside the phase calls too: the lean loop's 5 lines of the call and its
# logging), its statistics reduced over the processes and resumable (3), its separate optimizer, the policy stage's
# noise, the prioritised weights, the agent's extra flags (2)


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
MAX_ADDED = 166  # non-blank lines outside the blocks that a full file adds: the other side of its changed lines, the
# features' imports and flags (their fields in Args), and one-line additions, each marked with the [N] of its feature
# or naming its option: the calls into the plumbing (plumbing.Run's at each place of the loop), and the options'
# one-line calls (V-trace's epoch and the writes after its step, RND's rewards, the options' statistics) (PPG's is the
# larger)


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


# What a reader of a lean file reads in one sitting: its characters and lines without the PEP 723 block, its long
# lines, and no formatter pragmas (CleanRL's ppo_procgen.py: 346 lines and 14,595 characters, 15 lines over 100;
# its ppg_procgen.py: 480, 21,695 and 23)
LEAN_SIZES = {"ppo_procgen": (23_000, 470), "ppg_procgen": (30_000, 590)}  # characters, lines
MAX_LONG_LINES = 20  # over 100 characters: the formatter keeps 120, so the lean files write short statements
MAX_PPO_TO_PPG = 160  # lines of `diff ppo_procgen.py ppg_procgen.py`, both sides: what PPG adds to PPO, and no more


@pytest.mark.parametrize("lean", LEAN_SIZES)
def test_the_lean_file_is_read_in_one_sitting(lean):
    text = BLOCK.sub("", (ROOT / f"{lean}.py").read_text(), count=1)
    lines, (max_chars, max_lines) = text.splitlines(), LEAN_SIZES[lean]
    assert len(text) <= max_chars, f"{lean}.py: {len(text)} characters, over {max_chars}"
    assert len(lines) <= max_lines, f"{lean}.py: {len(lines)} lines, over {max_lines}"
    long = [line for line in lines if len(line) > 100]
    assert len(long) <= MAX_LONG_LINES, f"{len(long)} lines over 100 characters:\n" + "\n".join(long)
    pragmas = [line for line in lines if re.search(r"fmt: *(skip|off)|noqa", line)]
    assert not pragmas, "formatter pragmas:\n" + "\n".join(pragmas)


def test_the_lean_ppg_file_is_the_lean_ppo_file_and_its_phases():
    diff = subprocess.run(["diff", ROOT / "ppo_procgen.py", ROOT / "ppg_procgen.py"], capture_output=True, text=True)
    changed = [line for line in diff.stdout.splitlines() if line[:1] in "<>"]
    assert changed and len(changed) <= MAX_PPO_TO_PPG, f"{len(changed)} lines differ, over {MAX_PPO_TO_PPG}"


@pytest.mark.parametrize("name", [*TIERS, *TIERS.values()])
def test_no_statistic_is_read_by_position(name):
    """update_minibatch and aux_minibatch return their statistics by name; an index into them (`stats[4]`), or names
    zipped onto a stack in a fixed order, would silently shift when a term is added."""
    lines = (ROOT / f"{name}.py").read_text().splitlines()
    positional = re.compile(r"\b\w*stats\[-?\d|\bnames\.index\(|zip\(names\b")
    hits = [f"{name}.py:{i}: {line.strip()}" for i, line in enumerate(lines, 1) if positional.search(line)]
    assert not hits, "\n".join(hits)


# Where the two full files may differ: the algorithms themselves, and the fenced blocks each titles as its own
# ("(PPO)", "(PPG)"); every other definition and module-level block that both have is one text.
ALGORITHM = {"Args", "Agent", "check_args", "train", "update_minibatch"}


def shared_parts(name):
    """A full file's top-level definitions (by name) and module-level fenced blocks (by title, in order), without the
    algorithm's own: {key: text}."""
    lines = (ROOT / f"{name}.py").read_text().splitlines(keepends=True)
    blocks = fenced_blocks([line.rstrip("\n") for line in lines])
    own = {i for first, last, title in blocks if re.search(r"\((PPO|PPG)\)", title) for i in range(first, last + 1)}
    parts, defined = {}, set()
    for node in ast.parse("".join(lines)).body:
        first = node.lineno - len(getattr(node, "decorator_list", []))
        if isinstance(node, ast.Assign | ast.AnnAssign):
            key = ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            key = node.name
        else:
            continue
        defined |= set(range(first, node.end_lineno + 1))
        if key not in ALGORITHM and first not in own:
            parts[key] = "".join(lines[first - 1 : node.end_lineno])
    for first, last, title in blocks:
        if first not in own and not any(i in defined for i in (first, last)):  # a block of the module, not inside one
            key = f"block: {title}"
            parts[key] = parts.get(key, "") + "".join(lines[first - 1 : last])
    return parts


# What both full files define beyond the lean files' definitions (the algorithm): the algorithm's options, written in
# each full file beside the loop that uses them (V-trace [28], prioritised sampling [29], RND [33], the options'
# statistics, and rllte's hidden layer in the heads, an option of the network), and the two blocks that call into the
# plumbing (its import, and rllte's flag aliases). Everything else both need is the plumbing's, written once.
OPTIONS = {"RND", "rnd_cnn", "warm_up_rnd", "rnd_rewards", "vtrace_epoch", "vtrace_part", "vtrace_refresh"}
OPTIONS |= {"prioritized_segments", "minibatches", "weighted_mean", "option_stats", "option_charts", "head"}
OPTIONS |= {
    f"block: {title}" for title in ("RND [33]", "rllte's hidden layer in the heads", "the plumbing", "rllte aliases")
}
OPTIONS |= {"block: prioritised sampling [29] of env segments (Metta's PPO loss; Schaul et al., 2016)"}


def lean_definitions():
    names = set()
    for lean in TIERS:
        for node in ast.parse((ROOT / f"{lean}.py").read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.add(ast.unparse(node.targets[0]))
    return names


def test_the_full_files_share_only_the_algorithm_and_its_options():
    """Both full files define the lean files' definitions and the algorithm's options, each option as one text in
    both; a definition or a module-level block of plumbing written in both (not in plumbing.py) fails."""
    ppo, ppg = shared_parts("ppo_procgen_full"), shared_parts("ppg_procgen_full")
    shared = ppo.keys() & ppg.keys()
    assert not shared - lean_definitions() - OPTIONS, sorted(shared - lean_definitions() - OPTIONS)
    assert OPTIONS <= shared, sorted(OPTIONS - shared)  # each still in both: the list above is not stale
    differ = {key: list(difflib.unified_diff(ppo[key].splitlines(), ppg[key].splitlines(), lineterm="", n=0))[2:]
              for key in sorted(shared) if ppo[key] != ppg[key]}  # fmt: skip
    assert not differ, "\n".join(f"{key}:\n  " + "\n  ".join(lines) for key, lines in differ.items())


# The sizes a researcher reads (issue 71's targets): each full file, and train() in each
FULL_LINES = {"ppo_procgen_full": 1_100, "ppg_procgen_full": 1_350}
TRAIN_LINES = 200


@pytest.mark.parametrize("name", FULL_LINES)
def test_a_full_file_is_its_algorithm_and_calls_into_the_plumbing(name):
    text = (ROOT / f"{name}.py").read_text()
    assert len(text.splitlines()) <= FULL_LINES[name], f"{name}.py: {len(text.splitlines())} lines"
    train = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "train")
    assert train.end_lineno - train.lineno + 1 <= TRAIN_LINES, f"train(): {train.end_lineno - train.lineno + 1} lines"


def test_every_mistake_of_the_mutation_run_is_on_a_line_of_today_s_code():
    """tests/mutate.py's mistakes each change a line that stands in its file exactly once: a change that moves such a
    line fails here, in the suite, not at the mutation run's start (as one did, 2026-11-28)."""
    import mutate

    assert mutate.stale(mutate.MUTANTS) == []
