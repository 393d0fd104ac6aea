"""Command-line behaviour of each script: bad input, determinism, the files it writes."""

import io
import os
import platform
import signal
import subprocess
import sys

import pytest
import torch
import tyro
from conftest import (
    ROOT,
    assert_trained,
    load_script,
    narrow_lean,
    only_run_dir,
    outcome,
    parse,
    python,
    read_scalars,
    run_script,
    smoke_args,
    unwritable,
)

SCRIPTS = ["ppo_procgen", "ppg_procgen"]
FULL = {"ppo_procgen": "ppo_procgen_full", "ppg_procgen": "ppg_procgen_full"}

# (flags, the flag the one-line error must name): the common mistakes, which every tier stops
BAD_INPUTS = [
    (["--num-minibatches", "7"], "--num-minibatches"),
    (["--env-id", "starpilotx"], "--env-id"),
    (["--num-envs", "0"], "--num-envs"),
    (["--num-steps", "-4"], "--num-steps"),
    (["--num-eval-envs", "0"], "--num-eval-envs"),
    (["--total-timesteps", "100"], "--total-timesteps"),
    (["--distribution-mode", "memory"], "--distribution-mode"),
    (["--device", f"cuda:{torch.cuda.device_count()}"], "--device"),  # one past the GPUs this machine has
]
# every other flag's rule, and the flags of the features: the full files
FULL_BAD_INPUTS = [
    (["--num-levels", "-1"], "--num-levels"),
    (["--learning-rate", "0"], "--learning-rate"),
    (["--gamma", "1.5"], "--gamma"),
    (["--gae-lambda", "-0.1"], "--gae-lambda"),
    (["--clip-coef", "0"], "--clip-coef"),
    (["--clip-range-vf", "-0.2"], "--clip-range-vf"),
    (["--ent-coef", "-0.01"], "--ent-coef"),
    (["--vf-coef", "-1"], "--vf-coef"),
    (["--max-grad-norm", "0"], "--max-grad-norm"),
    (["--target-kl", "0"], "--target-kl"),
    (["--gamma", "nan"], "--gamma"),
    (["--batch-size", "3000"], "--minibatch-size"),
    (["--capture-video", "--eval-interval", "0"], "--capture-video"),
    (["--lr", "0"], "--learning-rate"),
    (["--checkpoint-interval", "-1"], "--checkpoint-interval"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints"),
    (["--resume", "x", "--eval-only", "y"], "--eval-only"),
    (["--prio-alpha", "-0.5"], "--prio-alpha"),
    (["--prio-beta0", "1.5"], "--prio-beta0"),
    (["--vtrace-rho-clip", "0"], "--vtrace-rho-clip"),
    (["--pretraining"], "--pretraining"),
    (["--intrinsic-coef", "-1"], "--intrinsic-coef"),
    (["--intrinsic-coef", "1", "--rnd-update-proportion", "0"], "--rnd-update-proportion"),
    (["--init-model", "x", "--resume", "y"], "--init-model"),
    (["--vtrace-c-clip", "-1"], "--vtrace-c-clip"),
    (["--prio-alpha", "0.6", "--num-envs", "12", "--num-minibatches", "8", "--num-steps", "64"], "--prio-alpha"),
]
SCRIPT_BAD_INPUTS = {
    "ppo_procgen": [],
    "ppg_procgen": [  # the phase, and the auxiliary minibatches that each step's group must divide
        (["--n-iteration", "0"], "--n-iteration"),
        (["--num-aux-rollouts", "0"], "--num-aux-rollouts"),
        (["--num-aux-rollouts", "4", "--n-aux-grad-accum", "3"], "--n-aux-grad-accum"),  # 512 minibatches
        (["--num-aux-rollouts", "3", "--n-aux-grad-accum", "2"], "--n-aux-grad-accum"),  # 683, the last of 2 rollouts
    ],
    "ppo_procgen_full": [(["--update-epochs", "0"], "--update-epochs")],
    "ppg_procgen_full": [
        (["--e-auxiliary", "0"], "--e-auxiliary"),
        (["--beta-clone", "-1"], "--beta-clone"),
        # 256 x 64 x 4096 observations of 12 KiB: 768 GiB, more than any machine has
        (["--n-iteration", "4096", "--total-timesteps", "100000000"], "--n-iteration"),
    ],
}
CASES = [(name, *case) for name in SCRIPTS for case in BAD_INPUTS + SCRIPT_BAD_INPUTS[name]]
CASES += [
    (FULL[name], *case)
    for name in SCRIPTS
    for case in BAD_INPUTS + SCRIPT_BAD_INPUTS[name] + FULL_BAD_INPUTS + SCRIPT_BAD_INPUTS[FULL[name]]
]

# rllte's (and Hsuanwu's) names for CleanRL's flags in the full files: (alias, the field it sets, a value, as parsed)
ALIASES = [("--tag", "exp_name", "t", "t"), ("--init-model-path", "init_model", "m.pt", "m.pt"),
           ("--lr", "learning_rate", "0.001", 0.001), ("--eps", "adam_eps", "1e-06", 1e-6),
           ("--discount", "gamma", "0.99", 0.99), ("--batch-size", "minibatch_size", "1024", 1024),
           ("--clip-range", "clip_coef", "0.1", 0.1)]  # fmt: skip
SCRIPT_ALIASES = {
    "ppo_procgen_full": [("--n-epochs", "update_epochs", "4", 4)],
    "ppg_procgen_full": [("--policy-epochs", "n_iteration", "16", 16), ("--aux-epochs", "e_auxiliary", "3", 3),
                         ("--kl-coef", "beta_clone", "2.0", 2.0), ("--num-aux-mini-batch", "num_aux_rollouts", "8", 8),
                         ("--num-aux-grad-accum", "n_aux_grad_accum", "2", 2),
                         ("--num-policy-mini-batch", "num_minibatches", "4", 4)],
}  # fmt: skip


@pytest.mark.parametrize("name", FULL.values())
def test_rllte_s_names_set_cleanrl_s_flags(name):
    script = load_script(name)
    for alias, field, value, parsed in ALIASES + SCRIPT_ALIASES[name]:
        args = parse(script, [alias, value])
        assert getattr(args, field) == parsed and getattr(args, field) != getattr(script.Args(), field), alias


@pytest.mark.parametrize("name", FULL.values())
def test_help_wraps_each_docstring_as_one_paragraph(monkeypatch, capsys, name):
    """`--help` of a full file, 100 columns wide: no line of a flag's help ends where the next line's first word would
    still have fitted, as it did where a docstring's own line ended (tyro keeps its line breaks)."""
    script = load_script(name)
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        script.plumbing.parse_args(script.Args, ["--help"])
    rows = [line.strip("│").rstrip() for line in capsys.readouterr().out.splitlines()]  # boxed on a terminal
    helps = [row.startswith(" " * 6) and not row.lstrip().startswith("-") for row in rows]  # a flag's help, indented
    width = max(len(row) for row, help in zip(rows, helps, strict=True) if help)  # the widest line of help
    assert sum(helps) > 80 and width > 90, rows  # every flag's help, as wide as asked
    for i in range(len(rows) - 1):
        if helps[i] and helps[i + 1]:  # a help line, and the next line of the same help
            assert len(rows[i]) + 1 + len(rows[i + 1].split()[0]) > width, f"cut short:\n{rows[i]}\n{rows[i + 1]}"


@pytest.mark.parametrize("name,flags,flag", CASES)
def test_bad_input_stops_with_one_line(tmp_path, monkeypatch, capsys, name, flags, flag):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "earlier.txt").write_text("kept")
    with pytest.raises(SystemExit) as exc:
        script.train(tyro.cli(script.Args, args=flags))
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], lines
    assert os.listdir(tmp_path / "runs") == ["earlier.txt"]  # nothing built, nothing lost


@pytest.mark.parametrize("name", SCRIPTS)
def test_envs_that_do_not_divide_among_processes(monkeypatch, capsys, name):
    script = load_script(FULL[name])
    monkeypatch.setenv("WORLD_SIZE", "4")  # as torchrun --nproc_per_node 4 sets it
    with pytest.raises(SystemExit) as exc:
        script.train(tyro.cli(script.Args, args=["--num-envs", "6", "--num-minibatches", "2"]))
    assert exc.value.code == 2
    assert (
        capsys.readouterr().err.strip()
        == f"{FULL[name]}.py: error: --num-envs 6: must divide among the 4 processes of torchrun"
    )


# a rule's error, and a parse error of tyro's: each one line on a real stderr, where tyro draws its box in Unicode
COMMAND_LINE_ERRORS = [
    (["--num-minibatches", "7"], "--num-minibatches 7: must divide"),
    (["--num-envs", "abc"], "Error parsing --num-envs: invalid literal for int() with base 10: 'abc'"),
]


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("flags,message", COMMAND_LINE_ERRORS)
def test_bad_input_from_the_command_line(tmp_path, name, flags, message):
    proc = run_script(f"{name}.py", flags, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    if "_full" not in name and message.startswith("Error parsing"):  # the lean files: tyro's own message
        assert "--num-envs" in proc.stderr and "'abc'" in proc.stderr, proc.stderr
    else:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{name}.py: error: {message}"), lines


@pytest.mark.parametrize(
    "name,flags", [(name, []) for name in FULL.values()] + [("ppg_procgen_full", ["--capture-video"])]
)
def test_an_unwritable_output_directory_is_one_line(tmp_path, monkeypatch, capsys, name, flags):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    where = "videos" if flags else "runs"
    (tmp_path / where).mkdir()
    (tmp_path / where / "earlier.txt").write_text("kept")
    with unwritable(tmp_path / where), pytest.raises(SystemExit) as exc:
        script.train(parse(script, [*smoke_args(name), *flags, "--device", "cpu", "--exp-name", "x"]))
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    flag = "--capture-video" if flags else "--exp-name"
    assert len(lines) == 1 and lines[0].startswith(f"{name}.py: error: {flag}: cannot write {where}/starpilot__x__1__")
    assert os.listdir(tmp_path / where) == ["earlier.txt"]  # nothing lost


@pytest.mark.parametrize("name", FULL.values())  # the full files' make_dir
def test_two_runs_started_in_the_same_second_get_a_directory_each(tmp_path, name):
    """Two identical runs at once, named after the same second: each gets its own run directory (the second with
    `_2`), says so, and keeps its own events and checkpoints there; none of them is shared."""
    flags = [*smoke_args(name), "--device", "cpu", "--eval-interval", "0", "--total-timesteps", "128"]  # 1 iteration
    flags += ["--checkpoint-interval", "1"]
    flags += ["--n-iteration", "1"] if "ppg" in name else []  # a phase of that one iteration
    cmd = [*python(), str(ROOT / "tests" / "helpers" / "fixed_clock.py"), name, *flags]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-2000:] for _, err in outs]
    base = f"starpilot__{name}__1__1800000000"
    run_dirs = sorted((tmp_path / "runs").iterdir())
    assert [d.name for d in run_dirs] == [base, f"{base}_2"]
    said = sorted(out.splitlines()[0].split("logs in runs/")[1].split(" ")[0] for out, _ in outs)
    assert said == [d.name for d in run_dirs]
    for run_dir in run_dirs:
        assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
        assert [step for step, _ in read_scalars(run_dir)["losses/policy_loss"]] == [128]  # one run's, once
        for ckpt in run_dir.glob("checkpoints/*.pt"):  # a resume of it continues this directory
            assert torch.load(ckpt, weights_only=False)["run_name"] == run_dir.name
    assert len(list(run_dirs[1].glob("checkpoints/*.pt"))) == len(list(run_dirs[0].glob("checkpoints/*.pt"))) > 0


@pytest.mark.parametrize("name", SCRIPTS)
def test_same_seed_same_losses_other_seed_not(tmp_path, monkeypatch, name):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    narrow_lean(script, monkeypatch)
    losses = {}
    for run, seed in (("a", 1), ("b", 1), ("c", 2)):
        args = tyro.cli(
            script.Args, args=[*smoke_args(name), "--device", "cpu", "--seed", str(seed), "--exp-name", run]
        )
        run_name = script.train(args)
        scalars = read_scalars(tmp_path / "runs" / run_name)
        losses[run] = [scalars[tag] for tag in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl")]
    assert losses["a"] == losses["b"]
    assert losses["a"] != losses["c"]


@pytest.mark.parametrize("name", ["ppo_procgen", *FULL.values()])
def test_video_and_model_are_written(tmp_path, name):
    """The full files write a video and the model, and say where; the lean file writes the model."""
    video = ["--capture-video"] if name in FULL.values() else []
    # 128 steps per env (PPG: 256, where the test env's first episode, the video's, ends later)
    steps = "1024" if name == "ppg_procgen_full" else "512"
    flags = [*smoke_args(name), "--total-timesteps", steps, "--device", "cpu", *video, "--save-model"]
    proc = run_script(f"{name}.py", flags, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    if video:
        videos = list((tmp_path / "videos" / run_dir.name).glob("*.mp4"))
        assert videos and all(v.stat().st_size > 1000 for v in videos), videos
        assert f"video: videos/{run_dir.name}/episode-0.mp4" in proc.stdout and "pkg_resources" not in proc.stderr
        assert f"logs in runs/{run_dir.name}" in proc.stdout.splitlines()[0]  # the banner says where the output goes
    model = run_dir / f"{name}.cleanrl_model"
    assert model.stat().st_size > 100_000  # the IMPALA network's weights, not an empty file
    scalars = read_scalars(run_dir)  # train and test episodes ended, and were logged
    assert scalars["charts/episodic_return"] and scalars["charts/test_episodic_return"]


def test_allocator_setting_changes_no_result(tmp_path):
    """mallopt is process-wide, so each setting runs in its own process; the losses must agree bit for bit."""
    losses = {}
    for setting in ("--tune-malloc", "--no-tune-malloc"):
        cwd = tmp_path / setting.strip("-")
        cwd.mkdir()
        proc = run_script("ppo_procgen_full.py", [*smoke_args("ppo_procgen_full"), "--device", "cpu", setting], cwd)
        assert proc.returncode == 0, proc.stderr[-3000:]
        scalars = read_scalars(only_run_dir(cwd))
        assert_trained(scalars, iterations=2)
        losses[setting] = [scalars[tag] for tag in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl")]
    assert losses["--tune-malloc"] == losses["--no-tune-malloc"]


@pytest.mark.parametrize("missing,named", [(["tyro"], "tyro"), (["procgen", "procgen_gym"], "procgen")])
def test_a_missing_package_is_one_line_naming_it(tmp_path, missing, named):
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in missing)  # as if not installed
    path = f"sys.path.insert(0, {str(ROOT)!r})"  # as `python SCRIPT` puts its directory first
    run = f"runpy.run_path({str(ROOT / 'ppo_procgen_full.py')!r}, run_name='__main__')"
    code = f"import runpy, sys; {blocked}; {path}; {run}"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"ppo_procgen_full.py: error: {named} is not installed for Python {platform.python_version()}: "
        "pip install -r requirements.txt"
    ]


def test_the_status_line_is_cleared_before_every_printed_line():
    """The full files' status line: drawn at most 4 times a second, erased before any other output, and at the end."""
    terminal = io.StringIO()
    status = load_script("ppo_procgen_full").plumbing.StatusLine(terminal)
    status.show("iter 1/2  rollout 3/32")
    print("iter 1/2  step 128", file=status)
    status.show("iter 2/2  rollout 1/32")  # within 0.25 s of the last drawing: not drawn
    assert terminal.getvalue() == "\r\033[Kiter 1/2  rollout 3/32\r\033[Kiter 1/2  step 128\n"
    status.drawn = 0.0
    status.show("iter 2/2  rollout 2/32")
    assert status.restore() is terminal
    assert terminal.getvalue().endswith("step 128\n\r\033[Kiter 2/2  rollout 2/32\r\033[K")


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("name", FULL.values())
def test_train_puts_back_the_process_settings(tmp_path, monkeypatch, name):
    """What `train` changes for the whole process (sys.stdout for the status line, the SIGINT and SIGTERM handlers,
    torch.distributions' argument checks, torch's CPU threads) is as before once it returns, and once it raises."""
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdout", Terminal())  # a terminal: the status line takes sys.stdout over

    def settings():
        handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
        return sys.stdout, handlers, torch.distributions.Distribution._validate_args, torch.get_num_threads()

    # the run's threads not this process's number: one for the run, one more here (the fixture puts them back), as a
    # run with more threads than a pytest worker's one would share two cores with the other worker's and spin-wait
    torch.set_num_threads(torch.get_num_threads() + 1)
    before, threads = settings(), ["--torch-threads", "1"]
    shown, during = [], set()  # what the status line was asked to draw (at most 4 times a second), and the threads
    monkeypatch.setattr(script.plumbing.StatusLine, "show", lambda self, text: shown.append(text) or during.add(
        torch.get_num_threads()))  # fmt: skip
    script.train(parse(script, [*smoke_args(name), "--device", "cpu", *threads]))
    assert settings() == before and during == {int(threads[1])}
    # the rollout, the update and PPG's auxiliary phase, each with the step it is at and the time left
    places = ["iter 1/2  rollout 1/32  step 4/256", "iter 2/2  update, epoch 1  step 256/256"]
    places += ["iter 2/2  auxiliary phase  epoch 1/1  minibatch 1/4  step 256/256"] if "ppg" in name else []
    assert all(any(text.startswith(place) and text.endswith("min left") for text in shown) for place in places), shown
    monkeypatch.setattr(script, "compute_gae", lambda *a, **k: 1 / 0)  # fails mid-run, with everything set
    with pytest.raises(ZeroDivisionError):
        script.train(parse(script, [*smoke_args(name), "--device", "cpu", "--exp-name", "again", *threads]))
    assert settings() == before


@pytest.mark.parametrize("name", ["ppo_procgen_full", "ppg_procgen_full"])
def test_what_cuda_graphs_cannot_take_is_refused_in_one_line(name, monkeypatch):
    """`--compile reduce-overhead` under torchrun (its gradients' all-reduce would be traced into a CUDA graph; no
    two GPUs have run it) and, in PPG, with gradients accumulated over auxiliary minibatches (a graph's next replay
    overwrites the `.grad` the next backward adds to): each one line naming the flag, exit status 2."""
    script = load_script(name)
    flags = [*smoke_args(name), "--device", "cpu", "--compile", "reduce-overhead"]
    assert outcome(script, flags)[0] == 0
    if "ppg" in name:
        status, lines = outcome(script, [*flags, "--n-aux-grad-accum", "2", "--num-aux-rollouts", "2"])
        assert status == 2 and len(lines) == 1 and lines[0].startswith(f"{name}.py: error: --n-aux-grad-accum 2: ")
    monkeypatch.setenv("WORLD_SIZE", "2")
    status, lines = outcome(script, flags)
    assert status == 2 and len(lines) == 1 and lines[0].startswith(f"{name}.py: error: --compile reduce-overhead: ")
