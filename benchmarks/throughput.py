"""Throughput of the scripts against procgen's own ceiling, side by side in one run.

    python benchmarks/throughput.py            # default sizes: about 35 minutes on 2 CPU cores (2 reps)
    python benchmarks/throughput.py --quick    # tiny sizes, under a minute: checks that the benchmark works
    python benchmarks/throughput.py --device cuda          # the same on a GPU
    python benchmarks/throughput.py --suite host           # the host side's ceiling (HOST.md): a few minutes

It measures, on this machine and in this one run:
  (a) the ceiling: procgen stepping 64 envs with random actions and no network, for several thread counts;
  (b) default-sized PPO iterations (64 envs x 256 steps, 8 minibatches, 3 epochs), split into env, inference,
      test-env (eval) and update time as the script itself logs them (perf/*), after a warm-up iteration;
  (c) PPG: its policy-phase iterations and one auxiliary epoch over a phase of 2 iterations;
  (d) each speed option on and off, the configurations alternating within every repetition (A B C A B C) so
      that the drift of a shared machine falls on all of them alike;
  (e) the peak memory (resident set) of every run;
  (f) with --suite host, what is not the network: each script's own rollout with the network replaced by one
      learned feature vector (a policy that ignores the image, run through train()), beside procgen alone.
Each configuration runs as its own process of the real script; figures are medians over the repetitions.
Results go to RESULTS.md and throughput.png in --out: this folder by default, and with --quick its quick/
subfolder (git-ignored), so that a check never overwrites the committed measurement.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (name, script, flags, environment): the first two PPO rows are the allocator A/B, then the other options
CONFIGS = [
    ("PPO fp32, glibc defaults", "ppo_procgen_full", ["--no-tune-malloc"], {}),
    ("PPO fp32 (default)", "ppo_procgen_full", [], {}),
    ("PPO fp32, OMP_WAIT_POLICY=PASSIVE", "ppo_procgen_full", [], {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("PPG dual (default)", "ppg_procgen_full", ["--n-iteration", "2", "--e-auxiliary", "1"], {}),
]
# the cost of the options against plain PPO, at a quarter of the default batch (16 envs x 256 steps, 8 minibatches)
OPTION_CONFIGS = [
    ("PPO (plain)", "ppo_procgen_full", [], {}),
    ("PPO --vtrace", "ppo_procgen_full", ["--vtrace"], {}),
    ("PPO --prio-alpha 0.6", "ppo_procgen_full", ["--prio-alpha", "0.6"], {}),
    ("PPO --intrinsic-coef 0.5 (RND)", "ppo_procgen_full", ["--intrinsic-coef", "0.5"], {}),
]
OPTION_SIZES = ["--num-envs", "16"]
QUICK_SIZES = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2"]
QUICK_PPG = ["--num-aux-rollouts", "2"]
# the host suite: each script's rollout at the default sizes, the network swapped for one linear layer; PPG closes
# its phase after 2 iterations, which leaves the rollout as it is and the phase buffer at 1/16 of its 6 GiB
# (name, script, flags, environment); OpenMP's idle threads spin by default, on the cores procgen's threads need
HOST_CONFIGS = [
    ("PPO, constant-feature network", "ppo_procgen_full", [], {}),
    ("PPO, constant-feature network, OMP_WAIT_POLICY=PASSIVE", "ppo_procgen_full", [], {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("PPG, constant-feature network", "ppg_procgen_full", ["--n-iteration", "2"], {}),
]


def ceiling(num_envs, steps, threads, reps):
    """Steps per second of procgen alone, random actions, the median over `reps` timings."""
    from ppo_procgen import ProcgenVecEnv

    env = ProcgenVecEnv(
        num_envs, 1, env_name="starpilot", num_levels=200, start_level=0, distribution_mode="easy", num_threads=threads
    )
    env.reset()
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 15, (steps, num_envs))
    for a in actions[: steps // 10]:  # warm-up
        env.step(a)
    timings = []
    for _ in range(reps):
        start = time.perf_counter()
        for a in actions:
            env.step(a)
        timings.append(num_envs * steps / (time.perf_counter() - start))
    env.close()
    return statistics.median(timings)


def tiny_network(obs_shape, feature_dim, init_fn):
    """In place of the IMPALA CNN: one learned feature vector, whatever the image, so that the policy is the same for
    every observation and what is timed is everything but the network."""
    import torch
    import torch.nn as nn

    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Parameter(torch.zeros(feature_dim))

        def forward(self, x):
            return self.features.expand(len(x), -1)

    return Constant()


def run_with_tiny_network(script, flags):
    """The script's own train(), its network swapped for `tiny_network` (a child process of `run`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(script, ROOT / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.impala_cnn = tiny_network
    module.train(module.parse_args(flags))


def run(script, flags, iterations, batch, workdir, device="cpu", tiny=False, env=None):
    """One process of the script; the perf/* of its last iteration and its peak memory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    total = batch * iterations
    entry = [__file__, "--tiny-network", script] if tiny else [str(ROOT / f"{script}.py")]
    cmd = [sys.executable, *entry, "--total-timesteps", str(total), "--device", device, "--exp-name", "bench", *flags]
    with tempfile.TemporaryDirectory(dir=workdir) as cwd:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        err = proc.stderr.read()
        if status != 0:
            raise SystemExit(f"benchmark run failed: {' '.join(cmd)}\n{err[-2000:]}")
        (run_dir,) = (Path(cwd) / "runs").iterdir()
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        last = {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"] if tag.startswith("perf/")}
    last["peak_rss_gib"] = usage.ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux
    last["sps"] = batch / last["perf/iteration_seconds"]
    rollout = last["perf/iteration_seconds"] - last["perf/eval_seconds"] - last["perf/update_seconds"]
    last["rollout_sps"] = batch / rollout  # the training envs' loop: stepping, inference, storage, bookkeeping
    return last


def machine(device="cpu"):
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    import torch

    cores = f"{os.cpu_count()} cores ({model})"
    gpu = f", {torch.cuda.get_device_name(torch.device(device))}" if device.startswith("cuda") else ""
    return f"{platform.machine()}, {cores}{gpu}, Python {platform.python_version()}, torch {torch.__version__}"


def default_out(quick):
    """The committed results live beside this file; a quick check writes to a git-ignored subfolder instead."""
    here = Path(__file__).resolve().parent
    return here / "quick" if quick else here


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: a check, not a measurement")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of every configuration (2; quick: 1)")
    parser.add_argument("--out", type=Path, default=None, help="where results go (this folder; quick: its quick/)")
    parser.add_argument("--suite", choices=["speed", "options", "host"], default="speed",
                        help="speed: the speed options at default sizes (RESULTS.md); options: V-trace, prioritised "
                        "sampling and RND against plain PPO at 16 envs (OPTIONS.md); host: the rollout without "
                        "the network, beside procgen alone (HOST.md)")  # fmt: skip
    parser.add_argument("--device", default="cpu", help="the scripts' --device: cpu, cuda, cuda:N")
    parser.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                        help="only the configurations whose names contain one of these texts")  # fmt: skip
    return parser.parse_args(argv)


def main():
    if sys.argv[1:2] == ["--tiny-network"]:  # a child process of `run`
        return run_with_tiny_network(sys.argv[2], sys.argv[3:])
    opts = parse()
    opts.out = (opts.out or default_out(opts.quick)).resolve()
    if opts.suite == "host":
        return host_suite(opts)
    reps = opts.reps or (1 if opts.quick else 2)
    configs = CONFIGS if opts.suite == "speed" else OPTION_CONFIGS
    configs = [c for c in configs if opts.only is None or any(text in c[0] for text in opts.only)]
    if not configs:
        raise SystemExit(f"throughput.py: error: --only {' '.join(opts.only)}: no configuration's name has it")
    sizes = QUICK_SIZES if opts.quick else (OPTION_SIZES if opts.suite == "options" else [])
    ppg_sizes = QUICK_PPG if opts.quick else []
    batch = 4 * 32 if opts.quick else (16 if opts.suite == "options" else 64) * 256
    opts.out.mkdir(parents=True, exist_ok=True)

    envs, steps = (8, 200) if opts.quick else (64, 2000)
    ceilings = {threads: ceiling(envs, steps, threads, reps) for threads in (1, 2, 4)}
    print("ceiling:", {t: round(v) for t, v in ceilings.items()}, flush=True)

    results = {name: [] for name, *_ in configs}
    for rep in range(reps):
        for name, script, flags, env in configs:
            extra = sizes + (ppg_sizes if script.startswith("ppg_procgen") else [])
            # 2 iterations: the first is the warm-up; PPG's second closes a phase with one auxiliary epoch
            results[name].append(run(script, [*flags, *extra], 2, batch, opts.out, opts.device, env=env))
            r = results[name][-1]
            print(f"rep {rep + 1}/{reps}  {name}: {r['sps']:.0f} steps/s, peak {r['peak_rss_gib']:.2f} GiB", flush=True)
        write_results(opts, configs, results, rep + 1, reps, ceilings, envs, batch)  # after every repetition


def host_suite(opts):
    """HOST.md: the rollout's host side (the script's loop with a near-constant policy) against procgen alone."""
    reps = opts.reps or (1 if opts.quick else 3)
    sizes = QUICK_SIZES if opts.quick else []
    batch = 4 * 32 if opts.quick else 64 * 256
    envs, steps = (8, 200) if opts.quick else (64, 2000)
    opts.out.mkdir(parents=True, exist_ok=True)
    ceilings = {threads: [] for threads in (1, 2, 4)}
    results = {name: [] for name, *_ in HOST_CONFIGS}
    for rep in range(reps):  # alternating, so that a shared machine's drift falls on every row alike
        for threads in ceilings:
            ceilings[threads].append(ceiling(envs, steps, threads, 1))
        for name, script, flags, env in HOST_CONFIGS:
            extra = sizes + (QUICK_PPG if opts.quick and script.startswith("ppg") else [])
            results[name].append(run(script, [*flags, *extra], 2, batch, opts.out, opts.device, tiny=True, env=env))
            print(f"rep {rep + 1}/{reps}  {name}: rollout {results[name][-1]['rollout_sps']:.0f} steps/s", flush=True)
    med = {name: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for name, rows in results.items()}
    cmd = "python benchmarks/throughput.py --suite host" + (" --quick" if opts.quick else "")
    cmd += (f" --reps {opts.reps}" if opts.reps else "") + (f" --device {opts.device}" if opts.device != "cpu" else "")
    lines = [
        "# The host side's ceiling" + (" (quick mode: tiny sizes, not a measurement)" if opts.quick else ""),
        "",
        f"Machine: {machine(opts.device)}.  ",
        f"Command: `{cmd}`, {time.strftime('%Y-%m-%d')}. Medians over {reps} repetition(s), the rows alternating.",
        f"Each script's own `train()` at {'tiny' if opts.quick else 'the default'} sizes (a batch of {batch} steps),",
        "its IMPALA CNN replaced by one learned feature vector (the policy ignores the image): what is left is what",
        "a faster network cannot remove. The rollout is the training envs' loop (stepping, the heads' inference and",
        "the images' conversion, storage, episode bookkeeping), with procgen's 4 threads (`--env-threads`):",
        "the iteration less the test envs (eval) and the update, as the script logs them (`perf/*`), of the second",
        "iteration.",
        "",
        "| configuration | rollout steps/s | env s | inference s | eval s | update s |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| procgen alone, {envs} envs, {threads} thread(s), random actions | {statistics.median(v):.0f} | | | | |"
        for threads, v in ceilings.items()
    ]
    for name, m in med.items():
        lines.append(
            f"| {name} | {m['rollout_sps']:.0f} | {m['perf/env_seconds']:.2f} | {m['perf/inference_seconds']:.2f} | "
            f"{m['perf/eval_seconds']:.2f} | {m['perf/update_seconds']:.2f} |"
        )
    (opts.out / "HOST.md").write_text("\n".join([*lines, ""]))
    print(f"wrote {opts.out / 'HOST.md'}")


def write_results(opts, configs, results, done, reps, ceilings, envs, batch):
    """The table (and chart) of the medians over the `done` repetitions measured so far."""
    med = {name: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for name, rows in results.items()}
    base = med[configs[0][0]]
    cmd = (
        "python benchmarks/throughput.py"
        + (" --quick" if opts.quick else "")
        + (f" --reps {opts.reps}" if opts.reps else "")
        + (f" --suite {opts.suite}" if opts.suite != "speed" else "")
        + (f" --device {opts.device}" if opts.device != "cpu" else "")
        + (" --only " + " ".join(f'"{text}"' for text in opts.only) if opts.only else "")
        + (
            f" --out {opts.out.relative_to(ROOT)}"
            if opts.out.is_relative_to(ROOT) and opts.out != default_out(opts.quick)
            else ""
        )
    )
    lines = [
        "# Throughput" + (" (quick mode: tiny sizes, not a measurement)" if opts.quick else ""),
        "",
        f"Machine: {machine(opts.device)}.  ",
        f"Command: `{cmd}`, {time.strftime('%Y-%m-%d')}. Medians over {done} of {reps} repetition(s); the",
        "configurations alternate within each repetition. Times are of one iteration after a warm-up, as the script",
        f"logs them (`perf/*`); a batch is {batch} steps. Ratios are against the first row, measured in the same run.",
        "",
        f"Ceiling, procgen alone ({envs} envs, random actions, no network): "
        + ", ".join(f"{round(v):,} steps/s with {t} thread(s)" for t, v in ceilings.items())
        + ".",
        "",
        "| configuration | steps/s | vs first row | env s | inference s | eval s | update s | PPG aux epoch s | peak "
        "RSS GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in med.items():
        aux = f"{m['perf/aux_seconds']:.1f}" if "perf/aux_seconds" in m else ""
        lines.append(
            f"| {name} | {m['sps']:.0f} | {m['sps'] / base['sps']:.2f}x | {m['perf/env_seconds']:.2f} | "
            f"{m['perf/inference_seconds']:.2f} | {m['perf/eval_seconds']:.2f} | {m['perf/update_seconds']:.2f} | "
            f"{aux} | {m['peak_rss_gib']:.2f} |"
        )
    lines += ["", "![throughput](throughput.png)", ""]
    if opts.suite == "options":
        lines[0] = "# The cost of the options" + (" (quick mode: tiny sizes, not a measurement)" if opts.quick else "")
        (opts.out / "OPTIONS.md").write_text("\n".join(lines[:-2]))  # no chart
        print(f"wrote {opts.out / 'OPTIONS.md'}")
        return
    (opts.out / "RESULTS.md").write_text("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(med)
    left = np.zeros(len(names))
    for part in ("env", "inference", "eval", "update"):
        widths = [med[n][f"perf/{part}_seconds"] for n in names]
        ax.barh(names, widths, left=left, label=part)
        left += widths
    ax.set_xlabel(f"seconds per iteration of {batch} steps (median of {done})")
    ax.invert_yaxis()
    ax.legend()
    ax.set_title("Where an iteration's time goes" + (" (quick mode)" if opts.quick else ""))
    fig.tight_layout()
    fig.savefig(opts.out / "throughput.png", dpi=100)
    print(f"wrote {opts.out / 'RESULTS.md'} and {opts.out / 'throughput.png'}")


if __name__ == "__main__":
    main()
