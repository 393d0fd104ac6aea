"""Checkpoints: exact resume, signals, the divergence guard, bad files, evaluation of a saved agent."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import tyro
from conftest import AUX_TAGS, DEVICES, ROOT, file_size_limit, load_script, read_scalars, smoke_args, unwritable

SCRIPTS = ["ppo_procgen_full", "ppg_procgen_full"]


def train(script, flags):
    return script.train(tyro.cli(script.Args, args=flags))


def after(scalars, step):
    """The logged values after `step`, tag by tag."""
    return {tag: [(s, v) for s, v in rows if s > step] for tag, rows in scalars.items()}


def sigterm_at_call(monkeypatch, script, name, n):
    """`script.name` raises a real SIGTERM at its n-th call; the list that counts its calls."""
    fn, calls = getattr(script, name), []

    def wrapper(*args):
        calls.append(1)
        if len(calls) == n:
            signal.raise_signal(signal.SIGTERM)
        return fn(*args)

    monkeypatch.setattr(script, name, wrapper)
    return calls


SEPARATE = ["--aux-optimizer", "separate"]  # PPG's auxiliary phase with an Adam of its own


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,extra", [(s, []) for s in SCRIPTS] + [("ppg_procgen_full", SEPARATE)],
                         ids=[*SCRIPTS, "ppg_procgen_full-separate"])  # fmt: skip
def test_interrupted_and_resumed_run_logs_the_same_losses(tmp_path, monkeypatch, capsys, name, extra, device):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    flags = [*smoke_args(name), "--total-timesteps", "512", "--device", device, *extra]  # 4 iterations; PPG: 2 phases
    straight = train(script, [*flags, "--exp-name", "straight"])
    straight_console = capsys.readouterr().out

    # a real SIGTERM during iteration 3 (for PPG, inside the second phase: the checkpoint carries its buffer)
    compute_gae = script.compute_gae
    sigterm_at_call(monkeypatch, script, "compute_gae", 3)
    with pytest.raises(SystemExit) as exc:
        train(script, [*flags, "--exp-name", "stopped"])
    assert exc.value.code == 128 + signal.SIGTERM
    (run_dir,) = (tmp_path / "runs").glob("*stopped*")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_00000003.pt"]
    if "ppg" in name:  # 3 iterations x 2 policy minibatches and 2 auxiliary epochs x 4 minibatches: in one Adam or two
        ckpt = torch.load(run_dir / "checkpoints" / "iter_00000003.pt", weights_only=False)
        steps = [{int(s["step"]) for s in (opt or {"state": {}})["state"].values()} for opt in
                 (ckpt["optimizer"], ckpt["aux_optimizer"])]  # fmt: skip
        assert steps == ([{6}, {8}] if extra else [{14, 8}, set()])  # shared: the auxiliary head's 8 steps, no more
        if extra:  # the auxiliary value head learns in the auxiliary phase only: the policy phase's Adam never saw it
            assert len(ckpt["aux_optimizer"]["state"]) == len(ckpt["optimizer"]["state"]) + 2
    monkeypatch.setattr(script, "compute_gae", compute_gae)
    assert train(script, [*flags, "--exp-name", "stopped", "--resume", str(run_dir)]) == run_dir.name
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
    # the interrupted run's log is whole: every iteration logged once
    assert [s for s, _ in b["losses/policy_loss"]] == [128, 256, 384, 512]


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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_writes_a_checkpoint_that_resumes(tmp_path, signum):
    """SIGTERM (a scheduler), and SIGHUP (the terminal or the ssh connection went away): the iteration finishes, a
    checkpoint is written, and the run resumes from it."""
    cmd = [
        sys.executable,
        str(ROOT / "ppo_procgen_full.py"),
        *smoke_args("ppo_procgen_full"),
        "--total-timesteps",
        "4096",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # wait until training runs, then ask it to stop
        if line.startswith("iter 1/"):
            proc.send_signal(signum)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    assert f"stopped by {signal.Signals(signum).name} after iteration" in out
    assert "resume with: python ppo_procgen_full.py --resume" in out
    (ckpt_path,) = (tmp_path / "runs").glob("*/checkpoints/iter_*.pt")
    ckpt = torch.load(ckpt_path, weights_only=False)
    stopped_at = ckpt["iteration"]
    assert ckpt["global_step"] == 128 * stopped_at and ckpt["model"]
    # the run's own flags come back as defaults: only the path and a new length are given
    total = 128 * (stopped_at + 1)
    done = subprocess.run([*cmd[:2], "--resume", str(ckpt_path.parent.parent), "--total-timesteps", str(total)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"iter {stopped_at + 1}/{stopped_at + 1}  step {total}" in done.stdout


@pytest.fixture(scope="module", params=SCRIPTS)
def trained(request, tmp_path_factory):
    """A smoke-sized run of each script with a checkpoint every iteration and the final model saved."""
    script = load_script(request.param)
    cwd, here = tmp_path_factory.mktemp(request.param), os.getcwd()
    os.chdir(cwd)
    try:
        flags = [*smoke_args(request.param), "--device", "cpu", "--checkpoint-interval", "1", "--save-model"]
        run_name = train(script, flags)
    finally:
        os.chdir(here)
    return script, flags, cwd / "runs" / run_name


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
    truncated = tmp_path / "iter_00000002.pt"
    truncated.write_bytes(checkpoints[-1].read_bytes()[:5000])
    (tmp_path / "empty_run").mkdir()
    other = "ppg_procgen_full" if script.SCRIPT == "ppo_procgen_full" else "ppo_procgen_full"
    cases = [
        (str(truncated), [], "not a readable checkpoint"),
        (str(tmp_path / "missing.pt"), [], "no such file"),
        (str(tmp_path / "empty_run"), [], "no checkpoint"),
        (str(checkpoints[0]), ["--feature-dim", "128"], "--feature-dim 256"),
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
    path = (
        run_dir / "checkpoints" / "iter_00000002.pt"
        if what == "checkpoint"
        else run_dir / f"{script.SCRIPT}.cleanrl_model"
    )
    returns = train(script, [*flags, "--eval-only", str(path), "--eval-episodes", "5"])
    assert len(returns) == 5 and all(map(torch.isfinite, torch.tensor(returns)))
    train_levels = train(script, [*flags, "--eval-only", str(path), "--eval-episodes", "3", "--eval-train-levels"])
    assert len(train_levels) == 3


def test_evaluation_refuses_weights_of_another_network(trained, tmp_path, monkeypatch, capsys):
    script, flags, run_dir = trained
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        train(script, [*flags, "--feature-dim", "64", "--eval-only", str(run_dir / f"{script.SCRIPT}.cleanrl_model")])
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
    first = script.save_checkpoint(str(tmp_path), "iter_00000001.pt", {"iteration": 1})

    def killed_mid_write(fd):
        os.write(fd, b"partial")
        raise KeyboardInterrupt  # as if the process died while the new file was being written, before the rename

    monkeypatch.setattr(os, "fsync", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        script.save_checkpoint(str(tmp_path), "iter_00000001.pt", {"iteration": 2})
    monkeypatch.undo()
    assert torch.load(first, weights_only=False) == {"iteration": 1}


def test_keep_checkpoints_prunes_the_oldest(tmp_path):
    script = load_script("ppo_procgen_full")
    for i in range(1, 6):
        script.save_checkpoint(str(tmp_path), f"iter_{i:08d}.pt", {"iteration": i}, keep=2)
        time.sleep(0.01)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["iter_00000004.pt", "iter_00000005.pt"]


def test_resuming_a_finished_run_says_so_and_writes_nothing(trained, monkeypatch, capsys):
    script, flags, run_dir = trained
    monkeypatch.chdir(run_dir.parent.parent)
    files = sorted(run_dir.rglob("*"))
    assert train(script, [*flags, "--resume", str(run_dir)]) == run_dir.name
    out = capsys.readouterr().out
    assert "is complete: 2 of 2 iterations, 256 steps" in out and "--total-timesteps 512" in out, out
    assert sorted(run_dir.rglob("*")) == files  # no new event file, no checkpoint


def copy_of_run(trained, tmp_path):
    """The trained run, copied to tmp_path/runs, so that a test may write to it or break it."""
    script, flags, run_dir = trained
    shutil.copytree(run_dir, tmp_path / "runs" / run_dir.name)
    return script, flags, tmp_path / "runs" / run_dir.name


def contents(run_dir):
    return {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}


def test_a_full_disk_skips_the_checkpoint_and_keeps_the_earlier_ones(trained, tmp_path):
    """A file-size limit below one checkpoint's size, as a full disk or a quota would: the resumed run goes on."""
    script, flags, run_dir = copy_of_run(trained, tmp_path)
    before = contents(run_dir / "checkpoints")
    limit = min(len(data) for data in before.values()) // 4  # the event files stay far below it

    # 2 more iterations, their checkpoints; no saved model, whose failed write would end the run (test_no_traceback)
    flags = [*flags, "--total-timesteps", "512", "--no-save-model", "--resume", str(run_dir)]
    proc = subprocess.run([sys.executable, str(ROOT / f"{script.SCRIPT}.py"), *flags], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, preexec_fn=file_size_limit(limit))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if "not written" in line]
    written = (4,) if script.SCRIPT == "ppg_procgen_full" else (3, 4)  # PPG: at the end of the one phase
    for iteration, line in zip(written, warnings, strict=True):
        path = f"runs/{run_dir.name}/checkpoints/iter_{iteration:08d}.pt"
        assert (
            line == f"{script.SCRIPT}.py: warning: {path} not written: File too large; the earlier checkpoints are kept"
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
    script.train(script.parse_args(argv, default=script.cli_defaults(argv)))
    assert len(reads) == 1, reads


def test_flags_given_beside_resume_win_over_the_optimizer_s_saved_settings(trained, tmp_path, monkeypatch):
    """Adam's state_dict carries its learning rate and epsilon; `--learning-rate` and `--adam-eps` must still win."""
    script, flags, run_dir = copy_of_run(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    restore_run, seen = script.restore_run, []

    def restore_and_look(ckpt, agent, optimizer, *a):
        mine = restore_run(ckpt, agent, optimizer, *a)
        seen.append({key: optimizer.param_groups[0][key] for key in ("lr", "eps")})
        return mine

    monkeypatch.setattr(script, "restore_run", restore_and_look)
    more = ["--total-timesteps", "512", "--learning-rate", "1e-4", "--adam-eps", "1e-6", "--resume", str(run_dir)]
    train(script, [*flags, *more])
    assert seen == [{"lr": 1e-4, "eps": 1e-6}]
    logged = read_scalars(run_dir)["charts/learning_rate"]
    assert [v for s, v in logged if s > 256] == pytest.approx([1e-4, 1e-4]) and logged[0][1] == pytest.approx(5e-4)


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
            script.train(script.parse_args(argv, default=script.cli_defaults(argv)))
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
    monkeypatch.setattr(script, "console", logged.append)
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
        script.train(script.parse_args([*argv, "--resume", str(newest)]))
    assert f"{newest}: not a readable checkpoint" in one_error_line(capsys, exc)
    assert script.train(script.parse_args([*argv, "--resume", str(run_dir)])) == run_dir.name
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"{script.SCRIPT}.py: warning: --resume: {newest}: skipped, not a readable "
                                "checkpoint (truncated?: RuntimeError)"], err  # fmt: skip
    assert f"resumed from {older}" in out
