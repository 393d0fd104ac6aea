"""The shared smoke harness: every script and option, on every device present, for a few hundred steps; the scripts at
their defaults are the smoke tier (`python -m pytest -m smoke`)."""

import math

import pytest
from conftest import (
    AUX_TAGS,
    DEVICES,
    NARROW,
    assert_trained,
    load_script,
    narrow_lean,
    on_device,
    only_run_dir,
    parse,
    read_scalars,
    run_script,
    smoke_args,
)

PER_ITERATION = [128, 256]  # the two iterations of a smoke run
AUX = dict.fromkeys(AUX_TAGS, [256])  # PPG's one auxiliary phase, closing iteration 2
PRIO = {"losses/prio_mean_weight": PER_ITERATION, "charts/prio_beta": PER_ITERATION}
VTRACE = {"losses/vtrace_rho_clipfrac": PER_ITERATION}
RND = {"losses/rnd_loss": PER_ITERATION, "charts/intrinsic_reward": PER_ITERATION}
PRETRAINING = ["--pretraining", "--intrinsic-coef", "1", "--rnd-obs-norm-steps", "8"]

SMOKE = pytest.mark.smoke  # the smoke tier, `python -m pytest -m smoke`: every script at its defaults

# one entry per script and option worth a smoke run: (script, extra flags, {tag that must be logged: its steps})
SCRIPTS = [
    pytest.param("ppo_procgen", [], {}, id="ppo", marks=SMOKE),
    pytest.param("ppo_procgen_full", [], {}, id="ppo-full", marks=SMOKE),
    pytest.param("ppg_procgen", [], AUX, id="ppg", marks=SMOKE),
    pytest.param("ppg_procgen_full", [], AUX, id="ppg-full", marks=SMOKE),
    pytest.param("ppo_procgen_full", ["--vtrace"], VTRACE, id="ppo-vtrace"),
    pytest.param("ppo_procgen_full", ["--prio-alpha", "0.6"], PRIO, id="ppo-prio"),
    pytest.param("ppo_procgen_full", ["--vtrace", "--prio-alpha", "0.6"], VTRACE | PRIO, id="ppo-vtrace-prio"),
    pytest.param("ppo_procgen_full", PRETRAINING, RND, id="ppo-rnd-pretraining"),
    pytest.param("ppo_procgen_full", ["--autocast", "bf16"], {}, id="ppo-bf16"),
    pytest.param("ppg_procgen", ["--arch", "shared"], AUX, id="ppg-shared"),
    pytest.param("ppg_procgen", ["--arch", "detach", "--init-fn", "orthogonal"], AUX, id="ppg-detach"),
    pytest.param(
        "ppg_procgen_full",
        ["--e-policy", "2", "--vtrace", "--prio-alpha", "0.6"],
        AUX | VTRACE | PRIO,
        id="ppg-vtrace-prio",
    ),  # fmt: skip
    pytest.param("ppg_procgen_full", PRETRAINING, AUX | RND, id="ppg-rnd-pretraining"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,extra,expected", SCRIPTS)
def test_smoke(tmp_path, monkeypatch, name, extra, expected, device):
    # the tier: the defaults (on a GPU, a full file's eager loop: its compiled defaults are test_gpu.py's)
    argv = [*smoke_args(name, network=NARROW if extra else []), *on_device(name, device), *extra]
    if extra:  # an option: its script's train() in this process, which has paid for the imports and procgen's start
        script = load_script(name)
        monkeypatch.chdir(tmp_path)
        script.train(parse(script, argv))
    else:  # the smoke tier: each script at its defaults as the command a researcher runs
        proc = run_script(f"{name}.py", argv, tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = read_scalars(only_run_dir(tmp_path))
    assert_trained(scalars, iterations=2)
    assert [step for step, _ in scalars["charts/SPS"]] == PER_ITERATION
    for tag, steps in expected.items():  # the option acted, or PPG's auxiliary phase ran, and logged finite values
        assert [step for step, _ in scalars.get(tag, [])] == steps, tag
        assert all(math.isfinite(value) for _, value in scalars[tag]), tag


CLEANRL_LINE = ["--num-envs", "1", "--num-steps", "64", "--total-timesteps", "256", "--num-minibatches", "2"]


@pytest.mark.parametrize("name", ["ppo_procgen", "ppo_procgen_full", "ppg_procgen", "ppg_procgen_full"])
def test_cleanrl_s_own_test_command_lines_train(tmp_path, monkeypatch, name):
    """CleanRL's tests run its procgen scripts with CLEANRL_LINE, PPG with `--n-iteration 1` too: ours train on them.
    A PPG phase of one rollout has fewer than `--num-aux-rollouts` (4): its one auxiliary minibatch holds that rollout,
    as CleanRL's does, and every phase ends in an auxiliary phase. (The network narrowed, as in the other loop tests:
    the lines' batch and phase shapes are what is checked.)"""
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    narrow_lean(script, monkeypatch)
    narrow = NARROW if name.endswith("_full") else []
    script.train(parse(script, [*CLEANRL_LINE, *narrow, *(["--n-iteration", "1"] if "ppg" in name else [])]))
    scalars = read_scalars(only_run_dir(tmp_path))
    assert_trained(scalars, iterations=4)
    for tag in AUX_TAGS if "ppg" in name else []:
        assert [step for step, _ in scalars[tag]] == [64, 128, 192, 256], tag
        assert all(math.isfinite(value) for _, value in scalars[tag]), tag
