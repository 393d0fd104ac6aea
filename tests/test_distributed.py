"""Data parallelism under torchrun, on the CPU with gloo: 2 processes train like one."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import AUX_TAGS, ROOT, assert_trained, load_script, only_run_dir, parse, read_scalars, routing, smoke_args

# On this machine gloo's connectFullMesh has, twice in about ten launches, been refused on 127.0.0.1 at process-group
# init (cause not established); one restart of torchrun's own absorbs such a start, and every assertion below still
# needs the whole run.
TORCHRUN = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc_per_node",
    "2",
    "--max-restarts",
    "1",
]


def env():
    """torchrun's environment: its workers run through a fork server (conftest's `routed`), and meet on the loopback
    interface."""
    return {**routing()[0], "GLOO_SOCKET_IFNAME": "lo"}


# gloo on the CPU; NCCL where two GPUs are there for the two processes (one GPU each)
TWO_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="< 2 GPUs"))]


def torchrun(args, cwd, timeout=300):
    return subprocess.run([*TORCHRUN, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env())


def torchrun_check(check, name, tmp_path):
    """Run a check of tests/helpers/ (ddp_*.py) on a script under torchrun; rank 0's JSON result."""
    out = tmp_path / "result.json"
    proc = torchrun([str(ROOT / "tests" / "helpers" / check), name, str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


# PPO on the CPU: the killed-process test below trains it under torchrun and checks the same
SYNC_RUNS = [
    ("ppg_procgen_full", "cpu"),
    *(pytest.param(name, "cuda", marks=TWO_DEVICES[1].marks) for name in ("ppo_procgen_full", "ppg_procgen_full")),
]


@pytest.mark.parametrize("name,device", SYNC_RUNS)
def test_two_processes_train_and_stay_in_sync(tmp_path, name, device):
    flags = [*smoke_args(name), "--total-timesteps", "512", "--device", device]  # 4 iterations, 128 steps per env
    proc = torchrun([str(ROOT / f"{name}.py"), *flags], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = read_scalars(only_run_dir(tmp_path))
    assert_trained(scalars, iterations=4)  # real updates, finite losses, logged once per iteration
    assert [step for step, _ in scalars["charts/SPS"]] == [128, 256, 384, 512]  # steps of both processes' envs
    assert scalars["charts/ranks_max_param_diff"] == [(512, 0.0)]  # both processes ended with the same weights
    for tag in AUX_TAGS if name == "ppg_procgen_full" else []:
        assert [step for step, _ in scalars[tag]] == [256, 512] and all(math.isfinite(v) for _, v in scalars[tag])
    assert scalars["charts/episodic_return"]  # gathered from the processes' envs


@pytest.mark.parametrize("name", ["ppo_procgen_full", "ppg_procgen_full"])
def test_two_processes_compute_the_gradient_and_the_rnd_statistics_of_one(tmp_path, name):
    """tests/helpers/ddp_checks.py: 2 processes of 2 envs each against 1 process of 4 envs."""
    rel = torchrun_check("ddp_checks.py", name, tmp_path)
    assert rel["data_parallel"] < 1e-5, rel  # global normalisation and the all-reduce: the one process's gradient
    assert rel["local_norm"] > 1e-3 and rel["no_reduce"] > 1e-3, rel  # without either, it differs
    assert rel["rnd_to_reference"] < 1e-5 and rel["rnd_between"] == 0, rel  # RND's statistics: the one process's


def children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found


def test_a_killed_process_restarts_the_job_from_its_checkpoint(tmp_path):
    total = 128 * 6
    flags = [
        *smoke_args("ppo_procgen_full"),
        "--total-timesteps",
        str(total),
        "--checkpoint-interval",
        "1",
        "--device",
        "cpu",
    ]
    cmd = [
        *TORCHRUN[:-1],
        "2",
        str(ROOT / "ppo_procgen_full.py"),
        *flags,
    ]  # the kill costs one restart, a flake one more
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
    deadline = time.time() + 180
    while not list(tmp_path.glob("runs/*/checkpoints/iter_00000002.pt")) and time.time() < deadline:
        time.sleep(0.2)
    workers = [w for w in children(proc.pid) if "ppo_procgen_full.py" in open(f"/proc/{w}/cmdline").read()]
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)  # one process dies mid-run
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "resumed from" in out
    scalars = read_scalars(only_run_dir(tmp_path))
    # the job finished, every iteration logged once (at both processes' steps): what the dead run logged after its
    # checkpoint was dropped
    assert_trained(scalars, iterations=6)  # real updates, finite losses
    assert [step for step, _ in scalars["losses/policy_loss"]] == [128 * i for i in range(1, 7)]
    assert scalars["charts/ranks_max_param_diff"] == [(total, 0.0)]  # both processes ended with the same weights
    assert scalars["charts/episodic_return"]  # gathered from the processes' envs


@pytest.mark.parametrize("name", ["ppo_procgen_full", "ppg_procgen_full"])
def test_torchrun_without_a_run_id_names_each_run_apart(name, monkeypatch, tmp_path):
    """torchrun without --rdzv-id or --standalone sets TORCHELASTIC_RUN_ID to "none": that must not become the run's
    name, or two runs share a directory and one's checkpoint rotation deletes the other's checkpoints."""
    script = load_script(name)
    monkeypatch.chdir(tmp_path)  # join_processes makes the run's directory
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    args = parse(script, [*smoke_args(name), "--device", "cpu"])
    script.check_args(args)
    run_name = script.plumbing.join_processes(args, torch.device("cpu"))
    assert run_name.rsplit("__", 1)[1].isdigit(), run_name
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    assert script.plumbing.join_processes(args, torch.device("cpu")).endswith("__job-7")


@pytest.mark.parametrize("name", ["ppo_procgen_full", "ppg_procgen_full"])
def test_a_restarted_job_without_a_checkpoint_starts_its_log_anew(name, tmp_path, monkeypatch):
    """torchrun restarts a named job that died before its first checkpoint: the run starts anew in its directory, and
    what the dead attempt logged is dropped, not mixed into the new one's curves."""
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    for restart in ("0", "1"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restart)
        run_name = script.train(parse(script, [*smoke_args(name), "--device", "cpu"]))
    assert run_name.endswith("__job-1") and len(list((tmp_path / "runs").iterdir())) == 1
    assert [step for step, _ in read_scalars(tmp_path / "runs" / run_name)["losses/policy_loss"]] == [128, 256]
