"""Checkpoints: exact resume, signals, the divergence guard, bad files, evaluation of a saved agent."""

import copy
import fcntl
import functools
import os
import shlex
import shutil
import signal
import subprocess
import time

import pytest
import torch
import tyro
from conftest import (
    AUX_TAGS,
    DEVICES,
    ROOT,
    file_size_limit,
    load_script,
    on_device,
    outcome,
    parse,
    python,
    read_scalars,
    smoke_args,
    unwritable,
)

pytestmark = pytest.mark.xdist_group(__name__)  # one worker: its module fixtures train once
SCRIPTS = ["ppo_procgen_full", "ppg_procgen_full"]


def train(script, flags):
    return script.train(tyro.cli(script.Args, args=flags))


def after(scalars, step):
    """The logged values after `step`, tag by tag."""
    return {tag: [(s, v) for s, v in rows if s > step] for tag, rows in scalars.items()}


def sigterm_at_call(monkeypatch, script, name, n):
    """`script.name` raises a real SIGTERM at its n-th call; the list that counts its calls."""
    fn, calls = getattr(script, name), []

    @functools.wraps(fn)  # its name: a compiled run keeps the advantages (`compute_gae`) eager by it
    def wrapper(*args):
        calls.append(1)
        if len(calls) == n:
            signal.raise_signal(signal.SIGTERM)
        return fn(*args)

    monkeypatch.setattr(script, name, wrapper)
    return calls


def record_updates(monkeypatch, script, update_minibatch):
    """`script.update_minibatch` (the given one) keeps, before each call, the weights, the optimizer's state and the
    minibatch it starts from; the list of them."""
    seen = []

    def wrapper(agent, optimizer, mb, *rest):
        seen.append(copy.deepcopy({"model": agent.state_dict(), "optimizer": optimizer.state_dict(), "mb": list(mb)}))
        return update_minibatch(agent, optimizer, mb, *rest)

    monkeypatch.setattr(script, "update_minibatch", wrapper)
    return seen


def differences(a, b, where=""):
    """Where two states differ, bit for bit: the paths of their keys and indices."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in differences(a.get(k), b.get(k), f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{where}/{i}")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return [] if a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) else [where]
    return [] if type(a) is type(b) and a == b else [where]


SEPARATE = ["--aux-optimizer", "separate"]  # PPG's auxiliary phase with an Adam of its own


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,extra", [(s, []) for s in SCRIPTS] + [("ppg_procgen_full", SEPARATE)],
                         ids=[*SCRIPTS, "ppg_procgen_full-separate"])  # fmt: skip
def test_interrupted_and_resumed_run_logs_the_same_losses(tmp_path, monkeypatch, capsys, name, extra, device):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    # 4 iterations; PPG: 2 phases
    flags = [*smoke_args(name), "--total-timesteps", "512", *on_device(name, device), *extra]
    update_minibatch = script.update_minibatch
    straight_updates = record_updates(monkeypatch, script, update_minibatch)
    straight = train(script, [*flags, "--exp-name", "straight"])
    straight_console = capsys.readouterr().out
    monkeypatch.setattr(script, "update_minibatch", update_minibatch)  # the runs below record nothing into it

    # a real SIGTERM during iteration 3 (for PPG, inside the second phase: the checkpoint carries its buffer)
    compute_gae = script.compute_gae
    sigterm_at_call(monkeypatch, script, "compute_gae", 3)
    with pytest.raises(SystemExit) as exc:
        train(script, [*flags, "--exp-name", "stopped"])
    assert exc.value.code == 128 + signal.SIGTERM
    (run_dir,) = (tmp_path / "runs").glob("*stopped*")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_00000003.pt"]
    if "ppg" in name:  # 3 iterations x 2 policy minibatches and 1 auxiliary epoch x 4 minibatches: in one Adam or two
        ckpt = torch.load(run_dir / "checkpoints" / "iter_00000003.pt", weights_only=False)
        steps = [{int(s["step"]) for s in (opt or {"state": {}})["state"].values()} for opt in
                 (ckpt["optimizer"], ckpt["aux_optimizer"])]  # fmt: skip
        assert steps == ([{6}, {4}] if extra else [{10, 4}, set()])  # shared: the auxiliary head's 4 steps, no more
        if extra:  # the auxiliary value head learns in the auxiliary phase only: the policy phase's Adam never saw it
            assert len(ckpt["aux_optimizer"]["state"]) == len(ckpt["optimizer"]["state"]) + 2
    monkeypatch.setattr(script, "compute_gae", compute_gae)
    resumed_updates = record_updates(monkeypatch, script, update_minibatch)
    assert train(script, [*flags, "--exp-name", "stopped", "--resume", str(run_dir)]) == run_dir.name
    # iteration 4's first update starts from what the uninterrupted run's did: where a resume parts from it, the
    # path says what: the weights, Adam's moments (the restore), or the minibatch (the rollout's games or draws)
    first = len(straight_updates) // 4 * 3
    assert differences(straight_updates[first], resumed_updates[0]) == []
    # and each of its updates after the first (a GPU's PPG with its own auxiliary Adam parted after the first, at the
    # seventh digit: where identical inputs give other outputs, the update itself differs between the two runs)
    for i, (a, b) in enumerate(zip(straight_updates[first:], resumed_updates, strict=True)):
        assert differences(a, b) == [], f"iteration 4's update {i + 1}: {differences(a, b)[:5]}"
    # the console's means of the recent returns go on from the checkpoint, as in the uninterrupted run
    last = [[line.split("left)")[1] for line in out.splitlines() if line.startswith("iter 4/4")]
            for out in (straight_console, capsys.readouterr().out)]  # fmt: skip
    assert last[0] == last[1] and "nan" not in last[0][0], last

    a, b = read_scalars(tmp_path / "runs" / straight), read_scalars(run_dir)
    tags = ["losses/policy_loss", "losses/value_loss", "losses/approx_kl", "charts/episodic_return"]
    tags += ["charts/test_episodic_return"] + (
        ["losses/aux/kl_loss", "losses/aux/real_value_loss"] if "ppg" in name else []
    )
    a_after, b_after = after(a, 384), after(b, 384)
    for tag in tags:
        assert a_after[tag] == b_after[tag], tag  # bitwise: procgen's state restores exactly
        assert a_after[tag] or "episodic" in tag, tag  # losses are logged every iteration; episodes end when they end
    # the interrupted run's log is whole: every iteration logged once. Sorted: TensorBoard reads a run's event files in
    # the order of their names, and two writers of one process in one second are named by a count (`.10` before `.9`)
    assert sorted(s for s, _ in b["losses/policy_loss"]) == [128, 256, 384, 512]


ANNEAL = ["--anneal-lr"]


@pytest.mark.parametrize("extra", [ANNEAL, [*SEPARATE, *ANNEAL]], ids=["shared-anneal-lr", "separate-anneal-lr"])
def test_a_ppg_run_stopped_inside_its_auxiliary_phase_resumes_from_that_epoch(tmp_path, monkeypatch, capsys, extra):
    """A signal in the second of three auxiliary epochs writes `iter_N.aux002.pt` (the phase buffer, the old logits,
    the losses so far, the random states, a separate auxiliary Adam); the resumed run skips the epochs done, logs
    what the uninterrupted run logs (the rest of the phase at the learning rate it had, annealed or not), and with
    --checkpoint-aux-epochs every epoch but the last writes one."""
    script = load_script("ppg_procgen_full")
    monkeypatch.chdir(tmp_path)
    flags = [*smoke_args("ppg_procgen_full"), "--total-timesteps", "512", "--e-auxiliary", "3", "--device", "cpu",
             *extra]  # fmt: skip
    straight = train(script, [*flags, "--exp-name", "straight", "--checkpoint-aux-epochs", "--keep-checkpoints", "9"])
    names = sorted(p.name for p in (tmp_path / "runs" / straight / "checkpoints").iterdir())
    assert names == ["iter_00000002.aux001.pt", "iter_00000002.aux002.pt", "iter_00000004.aux001.pt",
                     "iter_00000004.aux002.pt"]  # fmt: skip
    capsys.readouterr()

    policy_kl = script.policy_kl
    calls = sigterm_at_call(monkeypatch, script, "policy_kl", 6)  # the second epoch of the first phase
    with pytest.raises(SystemExit) as exc:
        train(script, [*flags, "--exp-name", "stopped"])
    assert exc.value.code == 128 + signal.SIGTERM and len(calls) == 8  # the epoch was finished, not the phase
    assert "after auxiliary epoch 2 of iteration 2, checkpoint" in capsys.readouterr().out
    (run_dir,) = (tmp_path / "runs").glob("*stopped*")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_00000002.aux002.pt"]
    calls.clear()
    monkeypatch.setattr(script, "policy_kl", lambda *a: calls.append(1) or policy_kl(*a))
    assert train(script, [*flags, "--exp-name", "stopped", "--resume", str(run_dir)]) == run_dir.name
    assert len(calls) == 4 + 12  # the third epoch of the first phase, then the second phase's three

    a, b = read_scalars(tmp_path / "runs" / straight), read_scalars(run_dir)
    for tag in [*AUX_TAGS, "losses/policy_loss", "losses/value_loss", "charts/episodic_return"]:
        assert a[tag] == b[tag], tag  # bitwise, the phase that was stopped included
    assert [s for s, _ in b["losses/aux/kl_loss"]] == [256, 512]


@pytest.mark.parametrize("at", [("compute_gae", 1), ("policy_kl", 6)], ids=["policy-phase", "auxiliary-phase"])
def test_a_ppg_run_told_to_stop_at_its_phase_end_writes_no_rollouts(tmp_path, monkeypatch, capsys, at):
    """`--stop-at-phase-end` (a campaign's chunks, whose checkpoints travel): a signal in a phase's first iteration, or
    in the second of its three auxiliary epochs, lets the phase finish; the checkpoint after it holds none of the
    phase's rollouts, and the resumed run logs what the uninterrupted run logs."""
    script = load_script("ppg_procgen_full")
    monkeypatch.chdir(tmp_path)
    flags = [*smoke_args("ppg_procgen_full"), "--total-timesteps", "512", "--e-auxiliary", "3", "--device", "cpu",
             "--stop-at-phase-end"]  # fmt: skip
    straight = train(script, [*flags, "--exp-name", "straight"])
    capsys.readouterr()
    fn = getattr(script, at[0])
    sigterm_at_call(monkeypatch, script, *at)
    with pytest.raises(SystemExit) as exc:
        train(script, [*flags, "--exp-name", "stopped"])
    out = capsys.readouterr()
    assert exc.value.code == 128 + signal.SIGTERM and "after iteration 2, checkpoint" in out.out, out.out
    assert "finishing this phase, its auxiliary epochs included" in out.err, out.err
    (run_dir,) = (tmp_path / "runs").glob("*stopped*")
    (ckpt,) = (run_dir / "checkpoints").iterdir()
    assert ckpt.name == "iter_00000002.pt"  # the first phase's end
    assert torch.load(ckpt, weights_only=True)["ranks"][0]["aux_obs"].shape[1] == 0  # no rollouts
    monkeypatch.setattr(script, at[0], fn)
    assert train(script, [*flags, "--exp-name", "stopped", "--resume", str(run_dir)]) == run_dir.name
    a, b = read_scalars(tmp_path / "runs" / straight), read_scalars(run_dir)
    for tag in [*AUX_TAGS, "losses/policy_loss", "losses/value_loss", "charts/episodic_return"]:
        assert a[tag] == b[tag], tag


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_writes_a_checkpoint_that_resumes(tmp_path, signum):
    """SIGTERM (a scheduler), and SIGHUP (the terminal or the ssh connection went away): the iteration finishes, a
    checkpoint is written, and the run resumes from it, by the command the run printed (its name has a space)."""
    script = [*python(), str(ROOT / "ppo_procgen_full.py")]
    cmd = [*script, *smoke_args("ppo_procgen_full"), "--total-timesteps", "4096", "--exp-name", "run 1"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # wait until training runs, then ask it to stop
        if line.startswith("iter 1/"):
            proc.send_signal(signum)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    assert f"stopped by {signal.Signals(signum).name} after iteration" in out
    resume = shlex.split(out.split("resume with: ")[1].splitlines()[0])  # as a shell reads it
    (ckpt_path,) = (tmp_path / "runs").glob("*/checkpoints/iter_*.pt")
    assert resume[:3] == ["python", "ppo_procgen_full.py", "--resume"] and tmp_path / resume[3] == ckpt_path
    ckpt = torch.load(ckpt_path, weights_only=False)
    stopped_at = ckpt["iteration"]
    assert ckpt["global_step"] == 128 * stopped_at and ckpt["model"]
    # the run's own flags come back as defaults: only the path and a new length are given
    total = 128 * (stopped_at + 1)
    done = subprocess.run([*script, *resume[2:], "--total-timesteps", str(total)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"iter {stopped_at + 1}/{stopped_at + 1}  step {total}" in done.stdout


def run_once(tmp_path_factory, script, flags):
    """A module fixture's run of `script`, in a directory of its own: its run directory."""
    cwd, here = tmp_path_factory.mktemp(script.SCRIPT), os.getcwd()
    os.chdir(cwd)
    try:
        return cwd / "runs" / train(script, flags)
    finally:
        os.chdir(here)


@pytest.fixture(scope="module", params=SCRIPTS)
def trained(request, tmp_path_factory):
    """A smoke-sized run of each script with a checkpoint every iteration and the final model saved; its name has a
    glob pattern's characters, which the run directory's checkpoints are found in spite of (rotation, `--resume
    RUN_DIR`: a sweep names its runs so)."""
    script = load_script(request.param)
    flags = [*smoke_args(request.param), "--device", "cpu", "--checkpoint-interval", "1", "--save-model"]
    flags += ["--exp-name", f"{request.param} [lr=1e-3]*"]
    return script, flags, run_once(tmp_path_factory, script, flags)


def saved_model(flags, run_dir):
    """The run's `--save-model` file, named after its `--exp-name`."""
    return run_dir / f"{flags[flags.index('--exp-name') + 1]}.cleanrl_model"


def one_error_line(capsys, exc):
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("trained", ["ppg_procgen_full"], indirect=True)
def test_a_ppg_checkpoint_holds_only_the_filled_part_of_the_phase_buffer(trained):
    """At a phase's end the phase buffer is spent: the checkpoint holds none of it, not a view of its whole storage."""
    script, flags, run_dir = trained
    ckpt = torch.load(run_dir / "checkpoints" / "iter_00000002.pt", weights_only=True)
    for key in ("aux_obs", "aux_returns"):
        assert ckpt["ranks"][0][key].shape[1] == 0 and ckpt["ranks"][0][key].untyped_storage().nbytes() == 0, key


def test_bad_checkpoints_are_refused_and_nothing_is_touched(trained, tmp_path, monkeypatch, capsys):
    script, flags, run_dir = trained
    monkeypatch.chdir(tmp_path)
    checkpoints = sorted((run_dir / "checkpoints").iterdir())
    if script.SCRIPT == "ppg_procgen_full":  # every iteration asked for, at the phase's end: the buffer is left out
        assert [p.name for p in checkpoints] == ["iter_00000002.pt"]
        assert torch.load(checkpoints[0], weights_only=False)["ranks"][0]["aux_obs"].numel() == 0
    else:
        assert [p.name for p in checkpoints] == ["iter_00000001.pt", "iter_00000002.pt"]
    older = tmp_path / "older.pt"  # a checkpoint written before --cnn-channels was a flag
    ckpt = torch.load(checkpoints[0], weights_only=False)
    torch.save({**ckpt, "args": {k: v for k, v in ckpt["args"].items() if k != "cnn_channels"}}, older)
    truncated = tmp_path / "iter_00000002.pt"
    truncated.write_bytes(checkpoints[-1].read_bytes()[:5000])
    (tmp_path / "empty_run").mkdir()
    other = "ppg_procgen_full" if script.SCRIPT == "ppo_procgen_full" else "ppo_procgen_full"
    cases = [
        (str(truncated), [], "not a readable checkpoint"),
        (str(tmp_path / "missing.pt"), [], "no such file"),
        (str(tmp_path / "empty_run"), [], "no checkpoint"),
        (str(checkpoints[0]), ["--feature-dim", "128"], "--feature-dim 256"),
        (str(checkpoints[0]), ["--cnn-channels", "2", "4"], "--cnn-channels 2, this run has 2 4"),
        (str(older), [], "made with --cnn-channels 16 32 32, this run has 2"),  # its run had the default network
        (str(checkpoints[0]), ["--num-envs", "8", "--total-timesteps", "1024"], "--num-envs 4"),
    ]
    if script.SCRIPT == "ppg_procgen_full":
        cases.append((str(checkpoints[0]), ["--arch", "shared"], "--arch dual"))
    for path, extra, message in cases:
        with pytest.raises(SystemExit) as exc:
            train(script, [*flags, *extra, "--resume", path])
        line = one_error_line(capsys, exc)
        assert line.startswith(f"{script.SCRIPT}.py: error: --resume: ") and message in line, line
    with pytest.raises(SystemExit) as exc:  # a checkpoint of the other script
        train(load_script(other), [*smoke_args(other), "--resume", str(checkpoints[0])])
    assert f"written by {script.SCRIPT}.py" in one_error_line(capsys, exc)
    assert sorted((run_dir / "checkpoints").iterdir()) == checkpoints  # the good checkpoints are still there
    assert torch.load(checkpoints[-1], weights_only=False)["iteration"] == 2
    assert not (tmp_path / "runs").exists()  # nothing was started


@pytest.mark.parametrize("what", ["checkpoint", "model"])
def test_evaluation_of_a_saved_agent(trained, tmp_path, monkeypatch, what):
    script, flags, run_dir = trained
    monkeypatch.chdir(tmp_path)
    path = run_dir / "checkpoints" / "iter_00000002.pt" if what == "checkpoint" else saved_model(flags, run_dir)
    if what == "model":  # every network of the run (PPG's dual: two) has the flags' channels, the tests' narrow 2
        weights = torch.load(path, weights_only=True)
        first_convs = [w.shape[0] for k, w in weights.items() if k.endswith("network.0.weight")]
        assert first_convs == ([2, 2] if script.SCRIPT.startswith("ppg") else [2])
    returns = train(script, [*flags, "--eval-only", str(path), "--eval-episodes", "5"])
    assert len(returns) == 5 and all(map(torch.isfinite, torch.tensor(returns)))
    train_levels = train(script, [*flags, "--eval-only", str(path), "--eval-episodes", "3", "--eval-train-levels"])
    assert len(train_levels) == 3


@pytest.mark.parametrize("other", [["--feature-dim", "64"], ["--cnn-channels", "4"]])
def test_evaluation_refuses_weights_of_another_network(trained, tmp_path, monkeypatch, capsys, other):
    script, flags, run_dir = trained
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        train(script, [*flags, *other, "--eval-only", str(saved_model(flags, run_dir))])
    assert "the weights do not fit this network" in one_error_line(capsys, exc)


@pytest.mark.parametrize("name", SCRIPTS)
def test_divergence_stops_the_run_and_keeps_the_good_checkpoints(tmp_path, monkeypatch, capsys, name):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    loss, calls = script.clipped_policy_loss, []

    per_iteration = 2 * (3 if name == "ppo_procgen_full" else 1)  # 2 minibatches x the policy epochs

    def nan_from_iteration_2(*a):
        calls.append(1)
        return loss(*a) * (float("nan") if len(calls) > per_iteration else 1.0)

    monkeypatch.setattr(script, "clipped_policy_loss", nan_from_iteration_2)
    with pytest.raises(SystemExit) as exc:
        phases = ["--n-iteration", "1"] if "ppg" in name else []  # PPG checkpoints at a phase's end: one per phase
        train(script, [*smoke_args(name), "--device", "cpu", "--checkpoint-interval", "1", "--eval-interval", "0",
                       *phases])  # fmt: skip
    assert exc.value.code == 3
    err = capsys.readouterr().err
    assert "diverged at iteration 2: losses/policy_loss is not finite" in err
    (ckpt_dir,) = (tmp_path / "runs").glob("*/checkpoints")
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["diverged_iter_00000002.pt", "iter_00000001.pt"]
    good = torch.load(ckpt_dir / "iter_00000001.pt", weights_only=False)
    diagnostic = torch.load(ckpt_dir / "diverged_iter_00000002.pt", weights_only=False)
    for key, value in good["model"].items():  # the diagnostic holds the last good weights, not the diverged ones
        assert torch.isfinite(value).all() and torch.equal(value, diagnostic["model"][key]), key


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    script = load_script("ppo_procgen_full")
    first = script.plumbing.save_checkpoint(str(tmp_path), "iter_00000001.pt", {"iteration": 1})

    def killed_mid_write(fd):
        os.write(fd, b"partial")
        raise KeyboardInterrupt  # as if the process died while the new file was being written, before the rename

    monkeypatch.setattr(os, "fsync", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        script.plumbing.save_checkpoint(str(tmp_path), "iter_00000001.pt", {"iteration": 2})
    monkeypatch.undo()
    assert torch.load(first, weights_only=False) == {"iteration": 1}


@pytest.mark.parametrize("name", SCRIPTS)
def test_only_the_last_checkpoint_missing_ends_the_run_with_status_4(name, tmp_path, monkeypatch, capsys):
    """A failed checkpoint followed by one written is no loss (the run's end says nothing); the last one failed is
    exit status 4 and one line. A run directory that is gone is not made again: its error goes to the caller."""
    script, run_dir = load_script(name), str(tmp_path / "run")
    os.mkdir(run_dir)

    def disk_full(*_):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(script.plumbing, "open", disk_full, raising=False)
        assert script.plumbing.save_checkpoint(run_dir, "iter_00000001.pt", {"iteration": 1}) is None
    assert script.plumbing.save_checkpoint(run_dir, "iter_00000002.pt", {"iteration": 2})
    script.plumbing.exit_unless_kept(run_dir)  # nothing missing: returns
    with monkeypatch.context() as patch:
        patch.setattr(script.plumbing, "open", disk_full, raising=False)
        script.plumbing.save_checkpoint(run_dir, "iter_00000003.pt", {"iteration": 3})
    with pytest.raises(SystemExit) as stop:
        script.plumbing.exit_unless_kept(run_dir)
    assert stop.value.code == 4 and capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"{name}.py: error: the run ended without its last checkpoint, {run_dir}/checkpoints/iter_00000003.pt; the "
        f"newest checkpoint kept is {run_dir}/checkpoints/iter_00000002.pt (iteration 2): resume with"
    )
    with monkeypatch.context() as patch:  # a model file not written: status 4 too
        patch.setattr(script.plumbing, "open", disk_full, raising=False)
        script.plumbing.save_model(torch.nn.Linear(1, 1), f"{run_dir}/model")
    with pytest.raises(SystemExit) as stop:
        script.plumbing.exit_unless_kept(run_dir)
    assert stop.value.code == 4
    shutil.rmtree(run_dir)
    with pytest.raises(FileNotFoundError):
        script.plumbing.save_checkpoint(run_dir, "iter_00000004.pt", {"iteration": 4})
    assert not os.path.exists(run_dir)


def test_keep_checkpoints_prunes_the_oldest(tmp_path):
    script = load_script("ppo_procgen_full")
    run_dir = tmp_path / "starpilot__lr[1e-3]__1__0"  # a name with a glob pattern's characters
    run_dir.mkdir()
    for i in range(1, 6):
        script.plumbing.save_checkpoint(str(run_dir), f"iter_{i:08d}.pt", {"iteration": i}, keep=2)
        time.sleep(0.01)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_00000004.pt", "iter_00000005.pt"]


def test_resuming_a_finished_run_says_so_and_writes_nothing(trained, monkeypatch, capsys):
    script, flags, run_dir = trained
    monkeypatch.chdir(run_dir.parent.parent)
    files = sorted(run_dir.rglob("*"))
    assert train(script, [*flags, "--resume", str(run_dir)]) == run_dir.name
    out = capsys.readouterr().out
    assert "is complete: 2 of 2 iterations, 256 steps" in out and "--total-timesteps 512" in out, out
    command = shlex.split(out.split("to extend it: ")[1].splitlines()[0])  # as a shell reads the run's odd name
    assert command[2:] == ["--resume", f"runs/{run_dir.name}", "--total-timesteps", "512"], command
    assert sorted(run_dir.rglob("*")) == files  # no new event file, no checkpoint


def copy_of(run_dir, tmp_path):
    """A run directory, copied to tmp_path/runs, so that a test may write to it or break it."""
    shutil.copytree(run_dir, tmp_path / "runs" / run_dir.name)
    return tmp_path / "runs" / run_dir.name


def copy_of_run(trained, tmp_path):
    """The trained run's script, flags and a copy of its directory."""
    script, flags, run_dir = trained
    return script, flags, copy_of(run_dir, tmp_path)


def contents(run_dir):
    return {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}


def test_a_full_disk_skips_the_checkpoint_and_keeps_the_earlier_ones(trained, tmp_path):
    """A file-size limit below one checkpoint's size, as a full disk or a quota would: the resumed run goes on to its
    end, each warning naming the newest checkpoint kept, and exits with status 4, saying how to resume from it."""
    script, flags, run_dir = copy_of_run(trained, tmp_path)
    before = contents(run_dir / "checkpoints")
    limit = min(len(data) for data in before.values()) // 4  # the event files stay far below it

    # 2 more iterations, their checkpoints; no saved model (its failed write is test_no_traceback's)
    flags = [*flags, "--total-timesteps", "512", "--no-save-model", "--resume", str(run_dir)]
    proc = subprocess.run([*python(), str(ROOT / f"{script.SCRIPT}.py"), *flags], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, preexec_fn=file_size_limit(limit))  # fmt: skip
    assert proc.returncode == 4, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if "not written" in line]
    written = (4,) if script.SCRIPT == "ppg_procgen_full" else (3, 4)  # PPG: at the end of the one phase
    kept = f"runs/{run_dir.name}/checkpoints/iter_00000002.pt"
    for iteration, line in zip(written, warnings, strict=True):
        path = f"runs/{run_dir.name}/checkpoints/iter_{iteration:08d}.pt"
        assert line == (
            f"{script.SCRIPT}.py: warning: {path} not written: File too large; the newest checkpoint kept is {kept} "
            "(iteration 2)"
        )
    assert proc.stderr.strip().splitlines()[-1] == (
        f"{script.SCRIPT}.py: error: the run ended without its last checkpoint, {path}; the newest checkpoint kept is "
        f"{kept} (iteration 2): resume with: python {script.SCRIPT}.py --resume {shlex.quote(kept)}"
    )
    assert "iter 4/4" in proc.stdout  # training went on to the end
    assert contents(run_dir / "checkpoints") == before  # no temporary file left, the earlier checkpoints whole


def test_resume_into_an_unwritable_run_directory_is_one_line(trained, tmp_path, monkeypatch, capsys):
    script, flags, run_dir = copy_of_run(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    before = contents(run_dir)
    with unwritable(run_dir), pytest.raises(SystemExit) as exc:
        train(script, [*flags, "--total-timesteps", "512", "--resume", str(run_dir)])
    line = one_error_line(capsys, exc)
    assert line == f"{script.SCRIPT}.py: error: --exp-name: cannot write runs/{run_dir.name}/: Permission denied"
    assert contents(run_dir) == before


def test_a_resumed_checkpoint_is_read_from_disk_once(trained, tmp_path, monkeypatch):
    """`--resume` takes the checkpoint's flags as the defaults (cli_defaults), then its state (train): one read."""
    script, _, run_dir = copy_of_run(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    reads, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: reads.append(a[0]) or load(*a, **k))
    argv = ["--resume", str(run_dir), "--total-timesteps", "384", "--no-save-model"]
    script.train(parse(script, argv, default=script.plumbing.cli_defaults(script.Args, argv)))
    assert len(reads) == 1, reads


def test_flags_given_beside_resume_win_over_the_optimizer_s_saved_settings(trained, tmp_path, monkeypatch):
    """Adam's state_dict carries its learning rate and epsilon; `--learning-rate` and `--adam-eps` must still win."""
    script, flags, run_dir = copy_of_run(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    restore_run, seen = script.plumbing.restore_run, []

    def restore_and_look(ckpt, agent, optimizer, *a):
        mine = restore_run(ckpt, agent, optimizer, *a)
        seen.append({key: optimizer.param_groups[0][key] for key in ("lr", "eps")})
        return mine

    monkeypatch.setattr(script.plumbing, "restore_run", restore_and_look)
    more = ["--total-timesteps", "512", "--learning-rate", "1e-4", "--adam-eps", "1e-6", "--resume", str(run_dir)]
    train(script, [*flags, *more])
    assert seen == [{"lr": 1e-4, "eps": 1e-6}]
    logged = read_scalars(run_dir)["charts/learning_rate"]
    assert [v for s, v in logged if s > 256] == pytest.approx([1e-4, 1e-4]) and logged[0][1] == pytest.approx(5e-4)


def test_a_checkpoint_of_a_compiled_gpu_run_resumes_on_a_cpu(trained, tmp_path, monkeypatch):
    """A run compiled on a GPU saves Adam's `capturable: True` (its step counts on the device); resumed on a CPU
    without `--compile`, Adam would stop at its first step ("If capturable=True, params and state_steps must be on
    supported devices"): the resumed run sets `capturable` by what it does itself."""
    script, flags, run_dir = copy_of_run(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    for path in sorted((run_dir / "checkpoints").glob("iter_*.pt")):
        ckpt = torch.load(path, weights_only=True)
        for key in [k for k in ("optimizer", "aux_optimizer") if ckpt.get(k)]:
            for group in ckpt[key]["param_groups"]:
                group["capturable"] = True
        torch.save(ckpt, path)
    train(script, [*flags, "--total-timesteps", "512", "--resume", str(run_dir)])
    assert len(read_scalars(run_dir)["losses/policy_loss"]) == 4


def test_resuming_with_rnd_switched_on_or_off_is_one_line(trained, tmp_path, monkeypatch, capsys):
    script, flags, run_dir = copy_of_run(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    before = contents(run_dir)
    with pytest.raises(SystemExit) as exc:
        train(script, [*flags, "--total-timesteps", "512", "--intrinsic-coef", "0.5", "--resume", str(run_dir)])
    line = one_error_line(capsys, exc)
    assert line.startswith(f"{script.SCRIPT}.py: error: --intrinsic-coef 0.5: ")
    assert "made with --intrinsic-coef 0.0; RND must be on in both runs or off in both" in line
    assert contents(run_dir) == before


class RunsCode:
    """An object whose unpickling calls os.mkdir: what a checkpoint from elsewhere could do with pickle."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(name, tmp_path, monkeypatch, capsys):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "the_code_ran"
    torch.save({"script": name, "args": {}, "iteration": 1, "x": RunsCode(str(marker))}, tmp_path / "iter_00000001.pt")
    for flag in ("--resume", "--eval-only", "--init-model"):
        with pytest.raises(SystemExit) as exc:
            argv = [*smoke_args(name), "--device", "cpu", flag, str(tmp_path / "iter_00000001.pt")]
            script.train(parse(script, argv, default=script.plumbing.cli_defaults(script.Args, argv)))
        line = one_error_line(capsys, exc)
        assert "not a readable checkpoint (holds more than tensors and plain values" in line, line
    assert not marker.exists()


def with_two_checkpoints(trained, tmp_path, monkeypatch):
    """A copy of the trained run with two checkpoints (PPG's smoke run has one, at its phase's end: a second phase),
    the flags that continue it, and its checkpoints; the current directory is tmp_path."""
    script, flags, run_dir = copy_of_run(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    if script.SCRIPT == "ppg_procgen_full":
        flags = [*flags, "--total-timesteps", "512"]
        train(script, [*flags, "--resume", str(run_dir)])
    checkpoints = sorted((run_dir / "checkpoints").iterdir())
    assert len(checkpoints) == 2
    return script, flags, run_dir, checkpoints


def test_a_torchrun_restart_continues_from_the_newest_checkpoint_not_the_resumed_file(trained, tmp_path, monkeypatch):
    """torchrun restarted a job begun with `--resume FILE`: it goes on from the run's newest checkpoint, not FILE."""
    script, flags, run_dir, (first, newest) = with_two_checkpoints(trained, tmp_path, monkeypatch)
    iterations = torch.load(newest, weights_only=False)["iteration"]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    logged = []
    monkeypatch.setattr(script.plumbing, "console", logged.append)
    assert train(script, [*flags, "--resume", str(first)]) == run_dir.name
    assert any(f"is complete: {iterations} of {iterations} iterations" in line for line in logged), logged


def test_a_run_directory_whose_newest_checkpoint_does_not_read_resumes_from_the_one_before(
    trained, tmp_path, monkeypatch, capsys
):
    """A newest checkpoint cut short (a copy, a file system that lost its tail): `--resume RUN_DIR` warns in one line
    naming it and goes on from the one before; the same file named by `--resume` stays a one-line error."""
    script, flags, run_dir, (older, newest) = with_two_checkpoints(trained, tmp_path, monkeypatch)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    capsys.readouterr()
    argv = [*flags, "--total-timesteps", str(torch.load(older, weights_only=False)["global_step"] + 128 * 2)]
    with pytest.raises(SystemExit) as exc:
        script.train(parse(script, [*argv, "--resume", str(newest)]))
    assert f"{newest}: not a readable checkpoint" in one_error_line(capsys, exc)
    assert script.train(parse(script, [*argv, "--resume", str(run_dir)])) == run_dir.name
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"{script.SCRIPT}.py: warning: --resume: {newest}: skipped, not a readable "
                                "checkpoint (truncated?: RuntimeError)",
                                f"{script.SCRIPT}.py: warning: --resume: {older} is older than 1 checkpoint(s) of its "
                                f"run, now in runs/{run_dir.name}/checkpoints/abandoned/; the run goes on from "
                                f"iteration {torch.load(older, weights_only=False)['iteration']}"], err  # fmt: skip
    assert f"resumed from {older}" in out


@pytest.fixture(scope="module", params=SCRIPTS)
def three_checkpoints(request, tmp_path_factory):
    """A smoke-sized run of each script with three checkpoints (PPO: iterations 1-3; PPG: its phase ends, 2, 4, 6)."""
    script = load_script(request.param)
    flags = [*smoke_args(request.param), "--device", "cpu", "--checkpoint-interval", "1", "--keep-checkpoints", "9"]
    per_checkpoint = 128 if request.param == "ppo_procgen_full" else 256
    run_dir = run_once(tmp_path_factory, script, [*flags, "--total-timesteps", str(3 * per_checkpoint)])
    assert len(list((run_dir / "checkpoints").glob("iter_*.pt"))) == 3
    return script, flags, per_checkpoint, run_dir


def test_a_resume_from_an_older_checkpoint_sets_the_newer_ones_aside(three_checkpoints, tmp_path, monkeypatch, capsys):
    """Resuming the first of three checkpoints abandons the other two: they move to checkpoints/abandoned/ (whole,
    with a warning naming them), so that `--resume RUN_DIR` goes on from the new line's checkpoint, not the old
    line's newest; and rotation keeps the checkpoint the run resumed from."""
    script, flags, per_checkpoint, trained_dir = three_checkpoints
    run_dir = copy_of(trained_dir, tmp_path)
    monkeypatch.chdir(tmp_path)
    first, second, third = sorted((run_dir / "checkpoints").glob("iter_*.pt"))
    old = {p.name: p.read_bytes() for p in (second, third)}
    capsys.readouterr()
    more = ["--total-timesteps", str(2 * per_checkpoint), "--keep-checkpoints", "1", "--resume", str(first)]
    assert train(script, [*flags, *more]) == run_dir.name
    err = capsys.readouterr().err
    assert f"{first} is older than 2 checkpoint(s) of its run, now in runs/{run_dir.name}/checkpoints/abandoned/" in err
    assert {p.name: p.read_bytes() for p in (run_dir / "checkpoints" / "abandoned").iterdir()} == old
    # the new line's checkpoint, and the one the run resumed from (rotation keeps it, --keep-checkpoints 1 or not)
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*.pt")) == [first.name, second.name]
    path, ckpt = script.plumbing.load_checkpoint(str(run_dir), "resume")
    assert path == str(run_dir / "checkpoints" / second.name) and ckpt["global_step"] == 2 * per_checkpoint


def test_keep_one_after_skipping_an_unreadable_newest_checkpoint_keeps_the_good_ones(
    three_checkpoints, tmp_path, monkeypatch, capsys
):
    """The run's newest checkpoint does not read and the one before it is gone (rotated): `--resume RUN_DIR` goes on
    from the first, and with --keep-checkpoints 1 the checkpoint it writes neither deletes itself nor the one it
    resumed from, while the unreadable file, which sorts after both, is set aside; the run resumes again after."""
    script, flags, per_checkpoint, trained_dir = three_checkpoints
    run_dir = copy_of(trained_dir, tmp_path)
    monkeypatch.chdir(tmp_path)
    first, second, third = sorted((run_dir / "checkpoints").glob("iter_*.pt"))
    second.unlink()
    third.write_bytes(third.read_bytes()[: third.stat().st_size // 2])
    more = ["--total-timesteps", str(2 * per_checkpoint), "--keep-checkpoints", "1", "--resume", str(run_dir)]
    assert train(script, [*flags, *more]) == run_dir.name
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*.pt")) == [first.name, second.name]
    assert [p.name for p in (run_dir / "checkpoints" / "abandoned").iterdir()] == [third.name]
    capsys.readouterr()
    assert train(script, [*flags, "--total-timesteps", str(3 * per_checkpoint), "--resume", str(run_dir)])
    assert f"resumed from {run_dir}/checkpoints/{second.name}" in capsys.readouterr().out


def test_a_second_run_in_a_run_directory_is_refused_while_the_first_holds_it(trained, tmp_path, monkeypatch, capsys):
    """The same `--resume RUN_DIR` started while the run still goes (its process holds the directory's lock): one
    line, and nothing in the directory changes; once that process is gone (its lock with it), the resume goes on."""
    script, flags, run_dir = copy_of_run(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    before = contents(run_dir)
    with open(run_dir / "lock", "a+") as held:  # what the running copy's process holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(SystemExit) as exc:
            train(script, [*flags, "--total-timesteps", "512", "--resume", str(run_dir)])
        line = one_error_line(capsys, exc)
        assert line.startswith(f"{script.SCRIPT}.py: error: --resume: runs/{run_dir.name}: in use by a run that is "
                               "still going"), line  # fmt: skip
        assert contents(run_dir) == before
    assert train(script, [*flags, "--total-timesteps", "512", "--resume", str(run_dir)]) == run_dir.name


def test_a_stale_temporary_checkpoint_is_removed_at_the_next_start_and_never_read(
    trained, tmp_path, monkeypatch, capsys
):
    """A second signal during a write leaves `iter_N.pt.tmp`, here a whole copy of a checkpoint: `--resume` of it is
    one line, and the next start of the run removes it, and the model file's that a kill during `--save-model` left."""
    script, flags, run_dir = copy_of_run(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    newest = sorted((run_dir / "checkpoints").glob("iter_*.pt"))[-1]
    stale = run_dir / "checkpoints" / "iter_00000007.pt.tmp"
    shutil.copy(newest, stale)
    stale_model = run_dir / "run.cleanrl_model.tmp"  # as `write_whole` names the model file's write
    stale_model.write_bytes(b"cut short")
    with pytest.raises(SystemExit) as exc:
        train(script, [*flags, "--total-timesteps", "512", "--resume", str(stale)])
    assert one_error_line(capsys, exc).endswith(f"--resume: {stale}: an unfinished checkpoint write, not a checkpoint")
    assert train(script, [*flags, "--total-timesteps", "512", "--resume", str(run_dir)]) == run_dir.name
    assert not stale.exists() and not stale_model.exists()


def test_a_run_resumed_within_the_same_second_keeps_its_events(tmp_path, monkeypatch):
    """TensorBoard reads a directory's event files in name order: the second, then the host, the process and a counter
    (`.10` sorts before `.9`). A run stopped and resumed within one second in one process (as the suite's tests do)
    can so have its resumed file read first: a purge marker in the new run's file, read after it, dropped every
    resumed event (a flaky suite, 2026-11-28). A new run writes none; here both files share their second, and the
    counter crosses from 9 to 10."""
    import types

    import tensorboard.summary.writer.event_file_writer as event_file_writer

    script = load_script("ppo_procgen_full")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(event_file_writer, "time", types.SimpleNamespace(time=lambda: 1_000.5))
    monkeypatch.setattr(event_file_writer._global_uid, "_value", 9)
    flags = [*smoke_args("ppo_procgen_full"), "--device", "cpu", "--checkpoint-interval", "1"]
    name = train(script, [*flags, "--total-timesteps", "256"])
    run_dir = tmp_path / "runs" / name
    assert train(script, [*flags, "--total-timesteps", "384", "--resume", str(run_dir)]) == name
    files = sorted(p.name for p in run_dir.glob("events.out.tfevents.*"))
    assert [f.rsplit(".", 1)[1] for f in files] == ["10", "9"], files  # the resumed file is read first
    assert sorted(step for step, _ in read_scalars(run_dir)["losses/policy_loss"]) == [128, 256, 384]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_restarted_torchrun_job_continues_its_own_run_not_one_that_shares_its_name(name, tmp_path, monkeypatch):
    """Two jobs with the same --rdzv-id, game, experiment name and seed (a sweep with a fixed id): the first has no
    checkpoint, the second (in `_2`) has. A restart of the second goes on from its own checkpoint, in its own
    directory, and the first's directory, its events included, stays as it was."""
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "sweep")
    per_phase = 128 if name == "ppo_procgen_full" else 256
    base = [*smoke_args(name), "--device", "cpu", "--total-timesteps", str(per_phase)]
    monkeypatch.setattr(os, "getppid", lambda: 1111)  # the first job's torchrun agent
    first = script.train(parse(script, base))
    monkeypatch.setattr(os, "getppid", lambda: 2222)  # the second job's
    second = script.train(parse(script, [*base, "--checkpoint-interval", "1"]))
    assert second == f"{first}_2"
    before = contents(tmp_path / "runs" / first)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    more = ["--checkpoint-interval", "1", "--total-timesteps", str(2 * per_phase)]
    logged = []
    monkeypatch.setattr(script.plumbing, "console", logged.append)
    assert script.train(parse(script, [*base, *more])) == second
    assert any(line.startswith(f"resumed from runs/{second}/checkpoints/") for line in logged), logged
    assert contents(tmp_path / "runs" / first) == before
    steps = [s for s, _ in read_scalars(tmp_path / "runs" / second)["losses/policy_loss"]]
    assert steps == list(range(128, 2 * per_phase + 1, 128))


def test_resuming_the_other_script_s_run_names_the_script_that_wrote_it(three_checkpoints):
    """`ppo_procgen_full.py --resume` of a PPG run (and the other way round) says whose checkpoint it is, before its
    flags meet this script's rules (a PPG run's sizes would fail PPO's defaults' batch rule first)."""
    script, _, _, run_dir = three_checkpoints
    other = load_script("ppg_procgen_full" if script.SCRIPT == "ppo_procgen_full" else "ppo_procgen_full")
    for flag in ("--resume", "--eval-only"):
        status, lines = outcome(other, [flag, str(run_dir)])
        assert status == 2 and lines == [f"{other.SCRIPT}.py: error: --{flag[2:]}: {run_dir}: written by "
                                         f"{script.SCRIPT}.py, not {other.SCRIPT}.py: python {script.SCRIPT}.py {flag} "
                                         f"{run_dir}"], lines  # fmt: skip


@pytest.mark.parametrize("name", SCRIPTS)
def test_rotation_deletes_only_older_checkpoints_and_never_the_resumed_one(tmp_path, name):
    """Rotation counts back from the checkpoint just written: a newer name (another line's file) is not its to delete,
    and the checkpoint the run resumed from stays, whatever `keep` is."""
    script = load_script(name)
    for i in (1, 2, 9):
        script.plumbing.save_checkpoint(str(tmp_path), f"iter_{i:08d}.pt", {"iteration": i})
    resumed = str(tmp_path / "checkpoints" / "iter_00000001.pt")
    script.plumbing.save_checkpoint(str(tmp_path), "iter_00000003.pt", {"iteration": 3}, keep=1, kept=resumed)
    names = ["iter_00000001.pt", "iter_00000003.pt", "iter_00000009.pt"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == names
