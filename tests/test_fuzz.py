"""Every flag of every script, fuzzed from its Args dataclass: each field gets the edge values of its type, and each
pair of fields that a rule ties together gets their combinations. A value either stops the script with exit status 2
and one line naming the flag, or it starts, perhaps after one-line warnings; never a traceback. The cases go through
`parse_args` and `check_args`, the functions the scripts' entry points call, so they cost no training."""

import dataclasses
import importlib.util
import itertools
import typing

import pytest
from conftest import load_script, outcome

SCRIPTS = ["ppo_procgen_full", "ppg_procgen_full"]  # the lean files stop the common mistakes alone (test_cli.py)
# the edge classes of each type: zero, negative, tiny, huge, overflowing, not a number, empty, unknown, the wrong type
EDGES = {
    int: ["0", "-1", "1", "3", str(2**31), str(2**63), "1.5", "1e3", "nan", "", "abc"],
    float: ["0", "-1", "1e-12", "0.5", "1", "1e30", "1e400", "nan", "inf", "-inf", "", "abc"],
    str: ["", " ", "no-such-name", "a/b", "x" * 300],
    tuple: ["", "0", "-1 4", "1", "2 4 4", " ".join(["1"] * 7), str(2**31), "2 1.5", "abc", "nan"],  # of ints
}
# names tyro does not know, and a stray positional argument
UNKNOWN = [["--no-such-flag", "1"], ["--num-env", "4"], ["--seed=1", "--seed"], ["stray"]]


def field_types(Args):
    """{name: (base type, optional, Literal choices or None)}, whatever the field's annotation is wrapped in."""
    types, hints = {}, typing.get_type_hints(Args)
    for field in dataclasses.fields(Args):
        hint, optional = hints[field.name], False
        if typing.get_origin(hint) is typing.Annotated:  # the full files' rllte aliases
            hint = typing.get_args(hint)[0]
        if type(None) in typing.get_args(hint):  # `X | None`
            hint, optional = next(t for t in typing.get_args(hint) if t is not type(None)), True
        choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
        hint = tuple if typing.get_origin(hint) is tuple else hint  # `tuple[int, ...]`: its values, split at spaces
        types[field.name] = (str if choices else hint, optional, choices)
    return types


def unruled(Args, rules):
    """The fields that need a rule and have none: every field but a bool or a Literal, whose type is its rule."""
    ruled = {flag for flags in rules for flag in flags}
    return [name for name, (base, _, choices) in field_types(Args).items() if base is not bool and not choices and
            name not in ruled]  # fmt: skip


def edge_argvs(Args):
    """(field, argv) for every edge value of every field."""
    for name, (base, optional, choices) in field_types(Args).items():
        flag = "--" + name.replace("_", "-")
        if base is bool:
            yield from [(name, [flag]), (name, [f"--no-{flag[2:]}"]), (name, [flag, "3"]), (name, [f"{flag}=maybe"])]
            continue
        values = [*(choices or []), "", "no-such-choice"] if choices else EDGES[base]
        for value in values + ["None"] * optional + [None]:  # None: the flag without its value
            yield name, [flag] if value is None else [flag, *value.split()] if base is tuple else [flag, value]


def dependencies(Args, tables):
    """(field, field it depends on), read from the code of each rule and warning: a rule that looks at `a.env_id`
    ties its field to env_id."""
    names = set(field_types(Args))
    for table in tables:
        for flags, (_, check) in table.items():
            for flag in flags:
                yield from ((flag, other) for other in sorted(set(check.__code__.co_names) & names - {flag}))


def message(script, lines):
    """The error's text: its one line, or the whole of tyro's box where a lean file leaves a malformed flag to tyro."""
    return lines[0] if lines[0].startswith(f"{script.SCRIPT}.py: error: ") else "\n".join(lines)


def assert_clean(script, argv, status, lines):
    name = script.SCRIPT
    if status == 0:  # it starts: nothing but warnings
        assert all(line.startswith(f"{name}.py: warning: --") for line in lines), (argv, lines)
    elif not hasattr(script, "parse_args") and not lines[0].startswith(f"{name}.py: error: "):  # lean: tyro's box
        text = "\n".join(lines)
        assert status == 2 and "Traceback" not in text and "--" in text, (argv, lines)
    else:
        assert status == 2 and len(lines) == 1 and lines[0].startswith(f"{name}.py: error: "), (argv, status, lines)


def rules_of(script):
    """A full file's rules: the plumbing's, then the script's own (the game's, the algorithm's and its options')."""
    return {**script.plumbing.RULES, **script.ALGORITHM_RULES}


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_field_needs_a_rule(name):
    script = load_script(name)
    assert unruled(script.Args, rules_of(script)) == []
    # the check itself: a field added without a rule is found
    extra = dataclasses.make_dataclass("Args", [("new_knob", int, dataclasses.field(default=3))], bases=(script.Args,))
    assert unruled(extra, rules_of(script)) == ["new_knob"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_fuzzed_flags_stop_with_one_line_or_start(tmp_path, monkeypatch, name):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)  # a relative path among the values is looked up here, in an empty directory
    # the rules, whatever this machine has free: PPG's default sizes need 12.2 GiB (test_no_traceback checks the memory)
    monkeypatch.setattr(script.plumbing, "host_memory", lambda: float(2**40))
    refused, cases, types = set(), 0, field_types(script.Args)
    for field, argv in edge_argvs(script.Args):
        status, lines = outcome(script, argv)
        assert_clean(script, argv, status, lines)
        cases += 1
        named = status == 2 and f"--{field.replace('_', '-')}" in message(script, lines)
        assert named or status == 0 or types[field][0] is bool, (argv, lines)  # a bool's stray value is named instead
        refused |= by_their_rules(script, [field], status, lines)
    for argv in UNKNOWN:
        status, lines = outcome(script, argv)
        assert_clean(script, argv, status, lines)
        assert status == 2 and argv[0].split("=")[0] in message(script, lines), (argv, lines)
        cases += 1
    pairs = sorted(
        set(dependencies(script.Args, [rules_of(script), {**script.ALGORITHM_WARNINGS, **script.plumbing.WARNINGS}]))
    )
    assert pairs, "no rule ties two flags together"
    seen = set()  # each combination once: a default among the values, two flags that tie each other both ways
    for first, second in pairs:
        values = [combo_values(*types[field], getattr(script.Args, field)) for field in (first, second)]
        for a, b in itertools.product(*values):
            if (combination := frozenset([(first, a), (second, b)])) in seen:
                continue
            seen.add(combination)
            argv = [*flag_argv(first, a), *flag_argv(second, b)]
            status, lines = outcome(script, argv)
            assert_clean(script, argv, status, lines)
            cases += 1
            refused |= by_their_rules(script, [first, second], status, lines)
    # every rule refuses some value that parses and is finite, with its own message: a rule that allows everything is
    # no rule, though tyro's parse errors and the finite-number check still name its flag
    ruled = {flag for flags in rules_of(script) for flag in flags}
    if importlib.util.find_spec("wandb"):  # --track's rule refuses only where wandb is missing
        ruled.discard("track")
    assert ruled <= refused, f"rules that refused nothing: {sorted(ruled - refused)}"
    print(f"{name}: {len(types)} fields, {cases} cases, {len(pairs)} pairs of dependent flags")


def by_their_rules(script, fields, status, lines):
    """The fields among `fields` that this outcome refused by their own rule: one line naming the flag and ending in
    that rule's message."""
    rules = {flag: rule for flags, (rule, _) in rules_of(script).items() for flag in flags}
    line = lines[0] if status == 2 and len(lines) == 1 else ""
    head = f"{script.SCRIPT}.py: error: --"
    return {f for f in fields if f in rules and line.startswith(head + f.replace("_", "-")) and
            line.endswith(f": {rules[f]}")}  # fmt: skip


def combo_values(base, optional, choices, default):
    """A few values of a field for combinations: its default, the small and the large, and one that its rule refuses."""
    if choices:
        return list(choices)
    if base is bool:
        return [True, False]
    if base is str:
        return [str(default), "a/b"]
    return [str(default), "1", "64", "0"] + ["nan"] * (base is float) + ["None"] * optional


def flag_argv(field, value):
    """`--flag value`, or for a bool `--flag` and `--no-flag`."""
    flag = field.replace("_", "-")
    return [f"--{flag}" if value else f"--no-{flag}"] if isinstance(value, bool) else [f"--{flag}", value]
