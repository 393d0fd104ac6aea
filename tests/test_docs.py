"""Every command the README and the files' docstrings show runs as written: each script and benchmark accepts its
flags. The commands are parsed, not run: a flag a script lacks stops its parser, which is what a reader would hit."""

import ast
import re
import shlex
import sys

import pytest
from conftest import ROOT, import_file, load_script, narrow_lean, outcome, parse, smoke_args

sys.path.insert(0, str(ROOT / "benchmarks"))
SCRIPTS = ["ppo_procgen", "ppg_procgen", "ppo_procgen_full", "ppg_procgen_full"]
DOCUMENTED = [
    "README.md",
    "DETAILS.md",
    "FEATURES.md",
    "benchmarks/LEARNING.md",
    "benchmarks/SPEED.md",
    *(f"{name}.py" for name in SCRIPTS),
    "benchmarks/learning.py",
    "benchmarks/throughput.py",
]


def commands(path):
    """The shell commands in a Markdown file's bash blocks, or in a Python file's docstring (from `python` on)."""
    text = (ROOT / path).read_text()
    if path.endswith(".md"):
        lines = "".join(re.findall(r"```bash\n(.*?)```", text, re.S)).replace("\\\n", " ").splitlines()
    else:
        docstring = ast.get_docstring(ast.parse(text)).replace("\\\n", " ")
        lines = [line[line.index("python ") :] for line in docstring.splitlines() if "python " in line]
    for line in lines:
        for command in re.split(r"&&|;|&", line):  # one line may chain several
            tokens = shlex.split(command, comments=True)
            if any(token.endswith(".py") for token in tokens):
                yield tokens


def check(tokens):
    """Parse one command's arguments with the parser of the file it runs; a parse error exits (status 2)."""
    at = next(i for i, token in enumerate(tokens) if token.endswith(".py"))
    name, argv = tokens[at].removesuffix(".py").removeprefix("benchmarks/"), tokens[at + 1 :]
    if name in SCRIPTS:
        parse(load_script(name), argv)
    elif name == "learning":
        learning = __import__("learning")
        opts, extra = learning.parse(argv)
        if opts.command == "run":
            for script in opts.scripts:  # loaded as the tests load them (a plumbing module each), where it imports them
                load_script(script)
            learning.check_script_flags(opts.scripts, extra)
    elif name == "throughput":
        __import__("throughput").parse(argv)
    else:
        raise AssertionError(f"no parser known for {tokens[at]}")


@pytest.mark.parametrize("path", DOCUMENTED)
def test_documented_commands_parse(path):
    found = list(commands(path))
    assert found, f"no command found in {path}"
    for tokens in found:
        try:
            check(tokens)
        except SystemExit as exc:
            pytest.fail(f"{path}: `{shlex.join(tokens)}` stops at the parser (exit {exc.code})")


def test_a_flag_the_lean_scripts_lack_is_caught():
    """The check itself: the README's old learning command passed --env-threads to the lean scripts."""
    tokens = shlex.split("python benchmarks/learning.py run --scripts ppo_procgen -- --num-envs 16 --env-threads 1")
    with pytest.raises(SystemExit):
        check(tokens)
    check(tokens[:-2])  # without it, the same command parses


def test_every_numbered_marker_has_its_detail():
    """Each `[N]` in the scripts' comments points to detail N of DETAILS.md, and every detail is marked somewhere."""
    details = set(map(int, re.findall(r"^(\d+)\. \*\*", (ROOT / "DETAILS.md").read_text(), re.M)))
    marked = {n for name in SCRIPTS for n in markers(name)}
    assert details == set(range(1, 37))
    assert marked == details, (marked - details, details - marked)


def markers(name):
    """The `[N]` of a script's comments and docstrings, in the order they come."""
    found = []
    for line in (ROOT / f"{name}.py").read_text().splitlines():
        comment = line[line.index("#") :] if "#" in line else line if line.lstrip().startswith('"""') else ""
        found += [int(n) for n in re.findall(r"\[(\d+)\]", comment)]
    return found


@pytest.mark.parametrize("name,details", [("ppo_procgen", range(1, 19)), ("ppg_procgen", range(19, 25))])
def test_the_details_are_numbered_as_a_reader_meets_them(name, details):
    """DETAILS.md numbers PPO's details in the order a reader of ppo_procgen.py meets them, and PPG's in the order
    ppg_procgen.py adds them: each detail's first marker comes after the one before's."""
    firsts = list(dict.fromkeys(n for n in markers(name) if n in details))
    assert firsts == list(details), firsts


def test_the_error_lines_the_docs_quote_are_the_ones_the_scripts_print():
    """A quoted `script.py: error: --flag value: rule` must be what that script prints for that flag and value."""
    quoted = []
    for path in ("README.md", "DETAILS.md", "FEATURES.md"):
        quoted += re.findall(
            r"`((pp[og]_procgen(?:_full)?)\.py: error: (--[\w-]+) (\S+): [^`]+)`", (ROOT / path).read_text()
        )
    assert quoted, "no quoted error line"
    for line, name, flag, value in quoted:
        status, lines = outcome(load_script(name), [*smoke_args(name), "--device", "cpu", flag, value])
        assert status == 2 and lines == [line], (line, lines)


README_LINES = 200  # a landing page: what it is, how to run it, what it achieves; the rest is linked


def slug(heading):
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(path):
    """The relative links of a Markdown file that lead to no file, or to no heading of the file they name."""
    text, broken = (ROOT / path).read_text(), []
    for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", text, flags=re.S)):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (ROOT / path).parent / file if file else ROOT / path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
            broken += [] if anchor in map(slug, headings) else [target]
    return broken


def test_the_readme_is_a_landing_page_whose_links_lead_somewhere():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines; at most {README_LINES}"
    for path in [
        "README.md",
        "DETAILS.md",
        "FEATURES.md",
        *(p.relative_to(ROOT) for p in ROOT.glob("benchmarks/*.md")),
    ]:
        assert broken_links(path) == [], path


def test_a_broken_link_or_anchor_is_found(tmp_path, monkeypatch):
    """The check itself, on a page of its own: a missing file and a missing heading are found, good links are not."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# A page\n## Speed options\n")
    (tmp_path / "b.md").write_text("[ok](a.md#speed-options) [file](gone.md) [anchor](a.md#nothing) [web](https://x.y)")
    assert broken_links("b.md") == ["gone.md", "a.md#nothing"]


def recipe_edits():
    """The README's recipe for a new loss term, as (old text, new text, for the full files alone) per hunk: the diff
    block of its section "Copy and modify", its hunks apart at `@@` lines (`@@ the full files`: the next is theirs)."""
    section = (ROOT / "README.md").read_text().split("## Copy and modify")[1].split("\n## ")[0]
    (block,) = re.findall(r"```diff\n(.*?)```", section, re.S)
    hunks = [[]]
    for line in (line[2:] for line in block.splitlines() if line.strip()):  # in a list item: indented by two spaces
        hunks += [[line]] if line.startswith("@@") else []
        hunks[-1] += [] if line.startswith("@@") else [line]
    edits = []
    for hunk in hunks:
        full_only = bool(hunk) and hunk[0].startswith("@@") and "full" in hunk[0]
        body = [line for line in hunk if not line.startswith("@@")]
        old = "".join(f"{line[1:]}\n" for line in body if line[0] in " -")
        new = "".join(f"{line[1:]}\n" for line in body if line[0] in " +")
        edits.append((old, new, full_only))
    return edits


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_readme_s_recipe_for_a_new_loss_term_trains_and_logs_it(name, tmp_path, monkeypatch):
    """The README's diff blocks, applied as they are to a copy of each file (each block's old text found exactly once,
    from the start of a line): the copy trains with the new flag and logs the new statistic every iteration, finite;
    a full file refuses a value against the new rule in one line."""
    import math

    from conftest import read_scalars

    edits = recipe_edits()
    assert [full_only for *_, full_only in edits] == [False, False, True], edits
    text = (ROOT / f"{name}.py").read_text()
    for old, new, full_only in edits:
        if full_only and not name.endswith("_full"):
            continue
        anchored = "\n" + text  # whole lines: `RULES = {` is not the end of `ALGORITHM_RULES = {`
        assert anchored.count("\n" + old) == 1, f"{name}.py: the README's edit does not apply:\n{old}"
        text = anchored.replace("\n" + old, "\n" + new)[1:]
    (tmp_path / f"{name}.py").write_text(text)
    script = import_file(f"recipe_{name}", tmp_path / f"{name}.py")
    monkeypatch.chdir(tmp_path)
    narrow_lean(script, monkeypatch)  # the new term's shape and sign are what is checked
    run_name = script.train(parse(script, [*smoke_args(name), "--device", "cpu", "--value-l2-coef", "0.01"]))
    logged = read_scalars(tmp_path / "runs" / run_name)["losses/value_l2"]
    assert [step for step, _ in logged] == [128, 256] and all(math.isfinite(v) and v > 0 for _, v in logged), logged
    if name.endswith("_full"):
        status, lines = outcome(script, [*smoke_args(name), "--device", "cpu", "--value-l2-coef", "-1"])
        assert status == 2 and lines == [f"{name}.py: error: --value-l2-coef -1.0: must be >= 0"], lines
