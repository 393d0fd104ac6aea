"""Throughput of the scripts against procgen's own ceiling, side by side in one run.

    python benchmarks/throughput.py            # default sizes, 2 reps: 35 minutes on 2 CPU cores for 4 rows (now 7)
    python benchmarks/throughput.py --quick    # tiny sizes, under a minute: checks that the benchmark works
    python benchmarks/throughput.py --device cuda          # the same on a GPU
    python benchmarks/throughput.py --suite host           # the host side's ceiling (HOST.md): a few minutes
    python benchmarks/throughput.py --suite machine --device cuda  # 1 to 4 runs at once: the machine's total (GPU)

It measures, on this machine and in this one run:
  (a) the ceiling: procgen stepping 64 envs with random actions and no network, for several thread counts;
  (b) default-sized PPO iterations (64 envs x 256 steps, 8 minibatches, 3 epochs), split into env, inference,
      test-env (eval) and update time as the script itself logs them (perf/*), after a warm-up iteration;
  (c) PPG: its policy-phase iterations and one auxiliary epoch over a phase of 2 iterations;
  (d) each speed option on and off, the configurations alternating within every repetition (A B C A B C) so
      that the drift of a shared machine falls on all of them alike;
  (e) the peak memory (resident set) of every run;
  (f) with --suite host, what is not the network: each script's own train() with the network replaced by one
      learned feature vector (a policy that ignores the image) and a one-minibatch update, beside procgen alone;
  (g) with --suite machine, the machine full: 4, 1, 2 and 3 runs of the full PPO file at once, each at the defaults,
      the sum of their steps per second (MACHINE.md): how many runs a sweep or the protocol's campaign should share it.
Each configuration runs as its own process of the real script; figures are medians over the repetitions.
Results go to RESULTS.md and throughput.png in --out: this folder by default, and with --quick its quick/
subfolder (git-ignored), so that a check never overwrites the committed measurement.
"""

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
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
    ("PPO fp32, --rollout folded", "ppo_procgen_full", ["--rollout", "folded"], {}),
    ("PPO fp32, --compile default", "ppo_procgen_full", ["--compile", "default"], {}),
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
# the GPU suite (the GPU kit's): the lean loop first (the ratios' base: the full files' defaults on a CPU, and on a GPU
# before 2026-11-27), then the GPU's defaults (`--compile auto --rollout auto`: CUDA graphs and the folded rollout),
# PPG's two alike, then the options one by one. Each row runs 3 iterations and times the last 2 (their mean): a compiled
# stage compiles at its first call and records its CUDA graph at its second, all within the first iteration (each runs
# many times an iteration; the advantages, once, stay eager), and one untimed compiled run of PPO and one of PPG, at
# once, fill inductor's cache before the first compiled row. PPG's rows close a phase every iteration (`--n-iteration
# 1`), so each timed iteration holds a whole phase, its 6 auxiliary epochs included (over a phase's rollouts: per policy
# iteration the same auxiliary work as at the default 32). A row past the kit's --timeout is killed and the step's own
# limit cuts the rows at the end, so the last are the ones lost. The row of torch's CPU threads on every core is the GPU
# default before 2026-11-27 (now one thread): whether torch's idle OpenMP threads, which spin for a while after each
# parallel host copy (the observations' pinned copy, every step), took the cores that procgen's threads need
COMPILED, GRAPHS = ["--compile", "default"], ["--compile", "reduce-overhead"]
CORES = min(os.cpu_count() or 1, 256)
EAGER = ["--compile", "off", "--rollout", "plain"]  # the lean files' loop
PPG_ROW = ["--n-iteration", "1"]
GPU_CONFIGS = [
    ("PPO eager, --rollout plain (the lean loop)", "ppo_procgen_full", EAGER, {}),
    ("PPO default (a GPU: CUDA graphs, --rollout folded)", "ppo_procgen_full", [], {}),
    ("PPG eager, --rollout plain (phases of 1 iteration)", "ppg_procgen_full", [*EAGER, *PPG_ROW], {}),
    ("PPG default (phases of 1 iteration)", "ppg_procgen_full", PPG_ROW, {}),
    ("PPO default, torch's CPU threads on every core (--torch-threads N)", "ppo_procgen_full", ["--torch-threads",
                                                                                            str(CORES)], {}),
    ("PPO default, --autocast bf16", "ppo_procgen_full", ["--autocast", "bf16"], {}),
    ("PPO default, --env-threads 8", "ppo_procgen_full", ["--env-threads", "8"], {}),
    ("PPO CUDA graphs (--compile reduce-overhead), --rollout plain", "ppo_procgen_full", [*GRAPHS, "--rollout",
                                                                                           "plain"], {}),
    ("PPO eager, --rollout folded", "ppo_procgen_full", ["--compile", "off", "--rollout", "folded"], {}),
    ("PPO compiled stages (--compile default)", "ppo_procgen_full", [*COMPILED, "--rollout", "plain"], {}),
]  # fmt: skip
GPU_ITERATIONS, GPU_TIMED = 3, 2


def compiles(flags, device):
    """Whether a full file's run with `flags` compiles its stages on `device` (`--compile auto`: on a GPU)."""
    return flags[flags.index("--compile") + 1] != "off" if "--compile" in flags else device.startswith("cuda")


# one iteration of each, untimed, before the first compiled row (PPG's: a whole phase, whose auxiliary minibatch PPO
# has not); both at once, each a process of its own
WARM_UPS = [
    ("PPO", "ppo_procgen_full", [*GRAPHS, "--rollout", "folded"]),
    ("PPG", "ppg_procgen_full", [*GRAPHS, "--rollout", "folded", *PPG_ROW]),
]
QUICK_SIZES = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2"]
QUICK_NETWORK = ["--cnn-channels", "2"]  # the speed tables' full files in a check: one stack of 2 channels
QUICK_PPG = ["--num-aux-rollouts", "2"]
# the host suite: each script's own train() at the default sizes, its network swapped for one learned feature vector
# and its update cut to one minibatch, beside procgen alone on the same envs in the same process; PPG closes its phase
# after its last timed iteration (name, script, flags, environment); OpenMP's idle threads spin by default
HOST_CONFIGS = [
    ("PPO lean (ppo_procgen.py)", "ppo_procgen", [], {}),
    ("PPO full, --rollout plain", "ppo_procgen_full", ["--rollout", "plain"], {}),
    ("PPO full, --rollout folded", "ppo_procgen_full", ["--rollout", "folded"], {}),
    ("PPO full, --rollout folded, OMP_WAIT_POLICY=PASSIVE", "ppo_procgen_full", ["--rollout", "folded"],
     {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("PPG full (policy phase), --rollout folded", "ppg_procgen_full", ["--rollout", "folded", "--n-iteration", "4"],
     {}),
]  # fmt: skip


# the machine full: this many runs of the full PPO file at once, each a process at the defaults (a check: 1 and 2);
# four first, the figure a GPU machine's target is set in, then one alone, which each row is set against: the GPU
# kit's step may reach its time limit before the others
MACHINE_RUNS, QUICK_MACHINE_RUNS = (4, 1, 2, 3), (1, 2)


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


def tiny_network(obs_shape, feature_dim, init_fn, stacks=None):
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


def train_with_tiny_network(path, flags, **swaps):
    """Load the script at `path`, swap its network for `tiny_network`, cut each update epoch to its first minibatch,
    swap any other module attributes given (`swaps`), and run its own train(): the module, its args, and the seconds
    of every iteration as the script reports them."""
    import importlib.util

    import tyro

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    indices = module.minibatch_indices
    swaps = {"impala_cnn": tiny_network, "minibatch_indices": lambda *args: indices(*args)[:1], **swaps}
    for name, value in swaps.items():
        setattr(module, name, value)
    # an iteration's seconds: from its first policy step to its console line (`iter N/M ...`), each script's own
    seconds, start, policy_step = [], [], module.policy_step

    def timed_policy_step(*args, **kwargs):
        if not start:  # the iteration's first step starts its clock
            start.append(time.perf_counter())
        return policy_step(*args, **kwargs)

    def timed_print(*args, **kwargs):
        if start and str(args[0]).startswith("iter "):
            seconds.append(time.perf_counter() - start.pop())
        print(*args, **kwargs)

    module.policy_step, module.print = timed_policy_step, timed_print
    if hasattr(module, "plumbing"):  # a full file's console line is printed there
        module.plumbing.print = timed_print
    args = (
        module.plumbing.parse_args(module.Args, flags)
        if hasattr(module, "plumbing")
        else tyro.cli(module.Args, args=flags)
    )
    module.train(args)
    return module, args, seconds


def run_with_tiny_network(script, flags):
    """The script's own train() through `train_with_tiny_network`; then procgen alone, stepping the same training and
    test envs for the same steps with random actions. A child process of `host_run`: prints a JSON line of the
    seconds of every iteration and of procgen alone's."""
    import json

    module, args, seconds = train_with_tiny_network(ROOT / f"{script}.py", flags)
    alone, rng = 0.0, np.random.default_rng(0)
    for num_envs, seed, levels in ((args.num_envs, args.seed, args.num_levels), (args.num_eval_envs, args.seed + 1, 0)):
        envs = module.ProcgenVecEnv(num_envs, seed, env_name=args.env_id, distribution_mode=args.distribution_mode,
                                    num_levels=levels, start_level=args.start_level)  # fmt: skip
        envs.reset()
        actions = rng.integers(0, 15, (args.num_steps, num_envs))
        start = time.perf_counter()
        for a in actions:
            envs.step(a)
        alone += time.perf_counter() - start
    print(json.dumps({"iterations": seconds, "alone": alone}))


def host_run(script, flags, iterations, batch, workdir, device, env):
    """One child process of `run_with_tiny_network`: the training steps per second of train()'s iterations after the
    first (their median), procgen alone's, and the perf/* of the last iteration where the script logs them."""
    import json

    cmd = [sys.executable, __file__, "--tiny-network", script, "--total-timesteps", str(batch * iterations),
           "--update-epochs", "1", "--device", device, "--exp-name", "bench", *flags]  # fmt: skip
    if script.startswith("ppg"):  # PPG has no --update-epochs: one policy epoch is its default
        cmd = [c for c in cmd if c not in ("--update-epochs", "1")] + ["--e-auxiliary", "1"]
    stdout, _, acc, _ = run_logged(cmd, workdir, env)
    timed = json.loads(stdout.strip().splitlines()[-1])
    last = {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"] if tag.startswith("perf/")}
    last["sps"] = batch / statistics.median(timed["iterations"][1:])
    last["alone_sps"] = batch / timed["alone"]
    return last


def run_logged(cmd, workdir, env=None, timeout=None):
    """Run `cmd` in a directory of its own under `workdir`: its standard output, its resource usage (the peak
    memory), the scalar events of the one run directory it wrote, and its standard error. A failed run raises
    RunFailed, saying why; one that outlasts `timeout` seconds is killed with every process it started (inductor's
    compile workers too), and TimeoutError says so."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tempfile.TemporaryDirectory(dir=workdir) as cwd, tempfile.TemporaryFile("w+") as out:
        with tempfile.TemporaryFile("w+") as err:  # files, not pipes: the parent reads nothing until the child ends
            proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, text=True, env={**os.environ, **(env or {})},
                                    start_new_session=True)  # fmt: skip
            timer = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL)) if timeout else None
            if timer:
                timer.start()
            try:  # os.wait4: the child's own peak memory, which subprocess.run does not give
                _, status, usage = os.wait4(proc.pid, 0)
            except BaseException:  # Ctrl-C: the run, in a session of its own, does not get it from the terminal
                os.killpg(proc.pid, signal.SIGKILL)
                raise
            if timer:
                timer.cancel()
            if status == signal.SIGKILL and timeout:
                raise TimeoutError(f"killed after {timeout:g} s: {' '.join(cmd)}")
            err.seek(0)
            errors = err.read()
            if status != 0:
                raise RunFailed(os.waitstatus_to_exitcode(status), errors, cmd)
        out.seek(0)
        text = out.read()
        (run_dir,) = (Path(cwd) / "runs").iterdir()
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
    return text, usage, acc, errors


class RunFailed(SystemExit):
    """A benchmark run that exited with an error: its exit status and the last lines of its stderr. Uncaught, the
    benchmark stops with them, as any SystemExit; the speed tables catch it, write the row as failed, and go on."""

    def __init__(self, status, stderr, cmd):
        self.status, self.last = status, [line for line in stderr.strip().splitlines() if line.strip()][-3:]
        super().__init__(f"benchmark run failed (exit status {status}): {' '.join(cmd)}\n{stderr[-2000:]}")


def run(script, flags, iterations, batch, workdir, device="cpu", env=None, timeout=None, timed=1):
    """One process of the script; the perf/* of its last `timed` iterations (their mean), its peak memory, and the CUDA
    graphs that inductor said it skipped (their count, and the first reason in `skip_reason`)."""
    total = batch * iterations
    cmd = [sys.executable, str(ROOT / f"{script}.py"), "--total-timesteps", str(total), "--device", device,
           "--exp-name", "bench", *flags]  # fmt: skip
    start = time.perf_counter()
    _, usage, acc, errors = run_logged(cmd, workdir, env, timeout)
    row_seconds = time.perf_counter() - start  # the whole run: start, compile, every iteration, exit
    perf = [tag for tag in acc.Tags()["scalars"] if tag.startswith("perf/")]
    last = {tag: statistics.fmean(e.value for e in acc.Scalars(tag)[-timed:]) for tag in perf}
    last["peak_rss_gib"] = usage.ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux
    last["row_seconds"] = row_seconds
    # PPG with phases of one iteration (`--n-iteration 1`): each phase's auxiliary seconds are its iteration's too,
    # what a user waits for (the script logs them apart, after the iteration's own)
    steps = [e.step for e in acc.Scalars("perf/iteration_seconds")]
    aux = {e.step: e.value for e in acc.Scalars("perf/aux_seconds")} if "perf/aux_seconds" in perf else {}
    if aux and all(step in aux for step in steps):
        last["aux_per_iteration"] = statistics.fmean(aux[step] for step in steps[-timed:])
    last["sps"] = batch / (last["perf/iteration_seconds"] + last.get("aux_per_iteration", 0))
    rollout = last["perf/iteration_seconds"] - last["perf/eval_seconds"] - last["perf/update_seconds"]
    last["rollout_sps"] = batch / rollout  # the training envs' loop: stepping, inference, storage, bookkeeping
    skips = [line for line in errors.splitlines() if "skipping cudagraphs" in line]  # inductor's warning, per graph
    last["cudagraph_skips"], last["skip_reason"] = len(skips), (skips or [""])[0].strip()[:200]
    return last


def together(n, flags, iterations, batch, opts):
    """`n` runs of the full PPO file started at once, each a process with its own seed and its share of the cores for
    torch's threads (OpenMP's idle threads spin: n runs of all the cores each leave procgen's threads none; on a GPU
    the full file's `--torch-threads` default takes one whatever the share): each
    one's steps per second over whole iterations after its first (the median of its `perf/iteration_seconds`), and
    their sum."""
    from concurrent.futures import ThreadPoolExecutor

    env = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": str(max(1, os.cpu_count() // n))}

    def one(seed):
        cmd = [sys.executable, str(ROOT / "ppo_procgen_full.py"), "--total-timesteps", str(batch * iterations),
               "--device", opts.device, "--seed", str(seed), "--exp-name", "machine", *flags]  # fmt: skip
        acc = run_logged(cmd, opts.out, env, opts.timeout)[2]
        return batch / statistics.median(e.value for e in acc.Scalars("perf/iteration_seconds")[1:])

    with ThreadPoolExecutor(n) as pool:
        per_run = list(pool.map(one, range(1, n + 1)))
    return {"total": sum(per_run), "per_run": statistics.median(per_run)}


def machine_suite(opts):
    """MACHINE.md: for 1 to 4 runs at once, the machine's total steps per second and each run's, the rows alternating
    within each repetition."""
    reps = opts.reps or (1 if opts.quick else 3)
    sizes = [*QUICK_SIZES, *QUICK_NETWORK] if opts.quick else []
    batch, iterations = (4 * 32, 3) if opts.quick else (64 * 256, 4)
    opts.out.mkdir(parents=True, exist_ok=True)
    counts = [n for n in (QUICK_MACHINE_RUNS if opts.quick else MACHINE_RUNS) if not opts.only or str(n) in opts.only]
    results, not_measured = {n: [] for n in counts}, {}
    for rep in range(reps):
        for n in counts:
            try:
                results[n].append(together(n, sizes, iterations, batch, opts))
            except TimeoutError:
                not_measured[n] = f"timed out after {opts.timeout:g} s"
            except RunFailed as exc:
                not_measured[n] = f"failed, exit status {exc.status}: " + " / ".join(exc.last).replace("|", "/")
            r = results[n][-1] if n not in not_measured else None
            print(f"rep {rep + 1}/{reps}  {n} at once: " + (not_measured.get(n) or f"{r['total']:.0f} steps/s in all"),
                  flush=True)  # fmt: skip
            write_machine(opts, results, not_measured, reps, batch, iterations)
    if not_measured:
        raise SystemExit(f"throughput.py: {len(not_measured)} row(s) not measured: {', '.join(map(str, not_measured))}")


def write_machine(opts, results, not_measured, reps, batch, iterations):
    """MACHINE.md: the medians so far; a row that failed says why, one not run yet says so."""
    base = statistics.median(r["total"] for r in results[1]) if results.get(1) else None
    lines = [
        *page_head(opts, "machine", "# The machine full: runs at once", reps),
        f"N runs of `ppo_procgen_full.py` at its defaults ({'tiny sizes' if opts.quick else 'on the device'}), started",
        "together, each a process of its own with its own seed and its share of the cores for torch's threads",
        f"(`OMP_NUM_THREADS`: the cores / N, unless set; on a GPU the full file takes one), {iterations} iterations",
        f"of {batch} steps; each run's",
        "steps per second over whole iterations after its first (the median of its `perf/iteration_seconds`: the",
        "rollout, the test envs and the update), and their sum: what the machine gives when it is shared.",
        "",
        "| runs at once | steps/s in all | steps/s a run | in all, against one run alone |",
        "|---|---|---|---|",
    ]
    for n, rows in sorted(results.items()):
        if rows:
            total = statistics.median(r["total"] for r in rows)
            ratio = f"{total / base:.2f}x" if base else ""
            lines.append(f"| {n} | {total:.0f} | {statistics.median(r['per_run'] for r in rows):.0f} | {ratio} |")
        else:
            lines.append(f"| {n} | {not_measured.get(n, NOT_RUN)} |  |  |")
    (opts.out / "MACHINE.md").write_text("\n".join([*lines, ""]))
    print(f"wrote {opts.out / 'MACHINE.md'}")


# the CleanRL suite: CleanRL's own ppo_procgen.py, unmodified (given by path, with a Python that has its packages:
# gym 0.23, procgen, tyro), beside ours at the same sizes; each row's iterations timed alike, from its event files
OURS_BESIDE_CLEANRL = [
    ("ours: ppo_procgen.py (lean), fp32, no test envs (as CleanRL)", "ppo_procgen", ["--eval-interval", "0"]),
    ("ours: ppo_procgen.py (lean), fp32", "ppo_procgen", []),
    ("ours: ppo_procgen_full.py --rollout folded, fp32", "ppo_procgen_full", ["--rollout", "folded"]),
    ("ours: ppo_procgen_full.py --autocast bf16", "ppo_procgen_full", ["--autocast", "bf16"]),
]


def iteration_seconds(cmd, workdir, iterations):
    """Run `cmd` (a script that logs `losses/value_loss` once per iteration to runs/*), and return the seconds
    between the events of its last two iterations: one iteration after the others' warm-up, timed the same way
    for any script that logs CleanRL's tags."""
    times = [e.wall_time for e in run_logged(cmd, workdir)[2].Scalars("losses/value_loss")]
    assert len(times) == iterations, (cmd, times)
    return times[-1] - times[-2]


def cleanrl_suite(opts):
    """SPEED.md's side-by-side rows: CleanRL's ppo_procgen.py against ours, the rows alternating in every repetition."""
    if opts.cleanrl is None:
        raise SystemExit("throughput.py: error: --suite cleanrl needs --cleanrl PATH (CleanRL's ppo_procgen.py)")
    reps = opts.reps or (1 if opts.quick else 3)
    sizes = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2"] if opts.quick else []
    batch, iterations = (4 * 32, 3) if opts.quick else (64 * 256, 2)
    steps = ["--total-timesteps", str(batch * iterations), *sizes]
    python = opts.cleanrl_python or sys.executable
    rows = [("CleanRL's ppo_procgen.py, unmodified", [python, str(opts.cleanrl.resolve()), *steps])]
    rows += [(name, [sys.executable, str(ROOT / f"{script}.py"), *steps, "--device", opts.device, *flags])
             for name, script, flags in OURS_BESIDE_CLEANRL]  # fmt: skip
    if opts.device.startswith("cuda"):  # CleanRL takes the GPU when there is one
        rows[0][1].append("--cuda")
    opts.out.mkdir(parents=True, exist_ok=True)
    results = {name: [] for name, _ in rows}
    for rep in range(reps):
        for name, cmd in rows:
            results[name].append(iteration_seconds(cmd, opts.out, iterations))
            print(f"rep {rep + 1}/{reps}  {name}: {results[name][-1]:.1f} s per iteration", flush=True)
    base = statistics.median(results[rows[0][0]])
    cmd = "python benchmarks/throughput.py --suite cleanrl --cleanrl PATH" + (" --quick" if opts.quick else "")
    cmd += (f" --reps {opts.reps}" if opts.reps else "") + (f" --device {opts.device}" if opts.device != "cpu" else "")
    lines = [
        "# Beside CleanRL" + (" (quick mode: tiny sizes, not a measurement)" if opts.quick else ""),
        "",
        f"Machine: {machine(opts.device)}.  ",
        f"Command: `{cmd}`, {time.strftime('%Y-%m-%d')}, PATH being CleanRL's `cleanrl/ppo_procgen.py`, run with a",
        "Python that has its packages (gym 0.23.1, procgen, tyro). Seconds of one iteration of "
        f"{batch} steps after {iterations - 1} warm-up iteration(s), from the wall times of each run's",
        "`losses/value_loss` events (so every row is timed alike, CleanRL's too); medians over "
        f"{reps} repetition(s), the rows alternating; the speedup against CleanRL's median.",
        "",
        "| configuration | s per iteration (median) | all repetitions | steps/s | vs CleanRL |",
        "|---|---|---|---|---|",
    ]
    for name, seconds in results.items():
        med = statistics.median(seconds)
        lines.append(f"| {name} | {med:.1f} | {', '.join(f'{s:.1f}' for s in seconds)} | {batch / med:.0f} | "
                     f"{base / med:.2f}x |")  # fmt: skip
    (opts.out / "CLEANRL.md").write_text("\n".join([*lines, ""]))
    print(f"wrote {opts.out / 'CLEANRL.md'}")


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
    parser.add_argument("--suite", choices=["speed", "options", "host", "gpu", "cleanrl", "machine"], default="speed",
                        help="speed: the speed options at default sizes (RESULTS.md); options: V-trace, prioritised "
                        "sampling and RND against plain PPO at 16 envs (OPTIONS.md); host: train() without the "
                        "network, beside procgen alone (HOST.md); gpu: each GPU speed option alone and all together "
                        "(GPU_SPEED.md), for --device cuda; cleanrl: CleanRL's ppo_procgen.py beside ours "
                        "(CLEANRL.md); machine: 1 to 4 runs at once, the machine's total (MACHINE.md)")  # fmt: skip
    parser.add_argument("--cleanrl", type=Path, default=None, help="CleanRL's ppo_procgen.py, for --suite cleanrl")
    parser.add_argument("--cleanrl-python", default=None, help="a Python with CleanRL's packages (default: this one)")
    parser.add_argument("--device", default="cpu", help="the scripts' --device: cpu, cuda, cuda:N")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="each run's time limit: a run past it is killed and its row says so")  # fmt: skip
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
    if opts.suite == "cleanrl":
        return cleanrl_suite(opts)
    if opts.suite == "machine":
        return machine_suite(opts)
    reps = opts.reps or (1 if opts.quick else 2)
    configs = {"speed": CONFIGS, "options": OPTION_CONFIGS, "gpu": GPU_CONFIGS}[opts.suite]
    configs = [c for c in configs if opts.only is None or any(text in c[0] for text in opts.only)]
    if opts.quick:  # compiling takes a minute or more on a CPU: a check leaves it out
        configs = [c for c in configs if not compiles(c[2], opts.device)]
    if not configs:
        raise SystemExit(f"throughput.py: error: --only {' '.join(opts.only)}: no configuration's name has it")
    sizes = [*QUICK_SIZES, *QUICK_NETWORK] if opts.quick else (OPTION_SIZES if opts.suite == "options" else [])
    ppg_sizes = QUICK_PPG if opts.quick else []
    batch = 4 * 32 if opts.quick else (16 if opts.suite == "options" else 64) * 256
    opts.out.mkdir(parents=True, exist_ok=True)

    envs, steps = (8, 200) if opts.quick else (64, 2000)
    # procgen's threads beyond its default 4 where the machine has the cores (a GPU machine's 16): what a run could
    # gain from `--env-threads`
    threads = [t for t in (1, 2, 4, 8, 16) if t <= max(4, os.cpu_count() or 1)]
    ceilings = {n: ceiling(envs, steps, n, reps) for n in threads}
    print("ceiling:", {t: round(v) for t, v in ceilings.items()}, flush=True)

    results, not_measured = {name: [] for name, *_ in configs}, {}  # a row that failed or timed out: why
    notes = {}  # the warm-up's time; for each CUDA-graph row, what inductor said of its graphs (the last repetition)
    for rep in range(reps):
        for name, script, flags, env in configs:
            extra = sizes + (ppg_sizes if script.startswith("ppg_procgen") else [])
            if opts.suite == "gpu" and compiles(flags, opts.device) and "warm-up" not in notes:
                notes["warm-up"] = warm_up(opts, configs, sizes, ppg_sizes, batch)
            # the first iteration is the warm-up (compiled: the stages compile and record their graphs there)
            iterations, timed = (GPU_ITERATIONS, GPU_TIMED) if opts.suite == "gpu" else (2, 1)
            try:
                result = run(
                    script, [*flags, *extra], iterations, batch, opts.out, opts.device, env, opts.timeout, timed
                )
                results[name].append(result)
                skips, reason = result["cudagraph_skips"], result.pop("skip_reason")
                if skips:
                    notes[name] = f"{name}: inductor skipped {skips:g} CUDA graph(s); the first said `{reason}`"
                elif compiles(flags, opts.device) and "default" not in flags and opts.device.startswith("cuda"):
                    notes[name] = f"{name}: no CUDA graph skipped (inductor said none on stderr)"
            except TimeoutError:  # a row that hangs or compiles too long: said in the table, the rest go on
                not_measured[name] = f"timed out after {opts.timeout:g} s"
            except RunFailed as exc:  # a row that fails: its exit status and last stderr lines, the rest go on
                not_measured[name] = f"failed, exit status {exc.status}: " + " / ".join(exc.last).replace("|", "/")
            if name in not_measured:
                print(f"rep {rep + 1}/{reps}  {name}: {not_measured[name]}", flush=True)
            else:
                r = results[name][-1]
                print(
                    f"rep {rep + 1}/{reps}  {name}: {r['sps']:.0f} steps/s, peak {r['peak_rss_gib']:.2f} GiB",
                    flush=True,
                )
            write_results(
                opts, configs, results, rep + 1, reps, ceilings, envs, batch, not_measured, list(notes.values())
            )
    if not_measured:  # the tables are written; the exit status says that a row is missing
        raise SystemExit(f"throughput.py: {len(not_measured)} row(s) not measured: {', '.join(not_measured)}")


def warm_up(opts, configs, sizes, ppg_sizes, batch):
    """One untimed iteration with CUDA graphs of each script that a compiled row runs, PPO's and PPG's at once:
    inductor's caches (its graphs' code, Triton's kernels) filled before the first compiled row, so that no row pays
    the cold compile inside its time limit (on an H200 PPG's default row ran past 120 s without its own). A line for
    the table: how long each took, or why it did not finish."""
    import concurrent.futures

    scripts = {script for _, script, flags, _ in configs if compiles(flags, opts.device)}
    limit = opts.timeout and 2 * opts.timeout

    def one(name, script, flags):
        start, flags = time.time(), [*flags, *sizes, *(ppg_sizes if script.startswith("ppg_procgen") else [])]
        print(f"warm-up: {name} {' '.join(flags)}, one iteration (untimed)", flush=True)
        shown = " ".join(flags[: flags.index("--rollout") + 2])
        try:
            run(script, flags, 1, batch, opts.out, opts.device, {}, limit)
            return f"Warm-up: one iteration of {name} with `{shown}` from a cold cache, {time.time() - start:.0f} s."
        except TimeoutError:
            return f"Warm-up: one iteration of {name} with `{shown}` timed out after {limit:g} s."
        except RunFailed as exc:
            return f"Warm-up: {name} with `{shown}` failed, exit status {exc.status}: {' / '.join(exc.last)}"

    todo = [warm for warm in WARM_UPS if warm[1] in scripts]
    with concurrent.futures.ThreadPoolExecutor(len(todo)) as pool:
        return " ".join(pool.map(lambda warm: one(*warm), todo))


def host_suite(opts):
    """HOST.md: each script's own train() with a constant-feature network and a one-minibatch update, beside procgen
    alone on the same envs in the same process."""
    reps = opts.reps or (1 if opts.quick else 3)
    sizes = QUICK_SIZES if opts.quick else []
    batch, iterations = (4 * 32, 4) if opts.quick else (64 * 256, 4)
    opts.out.mkdir(parents=True, exist_ok=True)
    configs = [c for c in HOST_CONFIGS if opts.only is None or any(text in c[0] for text in opts.only)]
    results, not_measured = {name: [] for name, *_ in configs}, {}
    for rep in range(reps):  # alternating, so that a shared machine's drift falls on every row alike
        for name, script, flags, env in configs:
            extra = sizes + (QUICK_PPG if opts.quick and script.startswith("ppg") else [])
            extra += ["--compile", "off"] if script.endswith("_full") else []  # the loop eager, on a GPU too
            try:
                results[name].append(host_run(script, [*flags, *extra], iterations, batch, opts.out, opts.device, env))
            except RunFailed as exc:  # a row that fails: its exit status and last stderr lines, the rest go on
                not_measured[name] = f"failed, exit status {exc.status}: " + " / ".join(exc.last).replace("|", "/")
                print(f"rep {rep + 1}/{reps}  {name}: {not_measured[name]}", flush=True)
            else:
                r = results[name][-1]
                print(f"rep {rep + 1}/{reps}  {name}: {r['sps']:.0f} steps/s, procgen alone {r['alone_sps']:.0f}, "
                      f"ratio {r['sps'] / r['alone_sps']:.2f}", flush=True)  # fmt: skip
            write_host(opts, results, not_measured, reps, batch)  # after every row: a step cut short keeps them
    if not_measured:
        raise SystemExit(f"throughput.py: {len(not_measured)} row(s) not measured: {', '.join(not_measured)}")


# a row that has not run when a table is written: the table is rewritten after every row, so where a time limit stops
# the benchmark (the GPU kit's step), the rows it never reached stay named in the table
NOT_RUN = "not run: the benchmark is still going, or was stopped before this row"


def page_head(opts, suite, title, reps):
    """A suite's page's first lines: its title (a quick check said so), the machine, the command and its repetitions."""
    cmd = f"python benchmarks/throughput.py --suite {suite}" + (" --quick" if opts.quick else "")
    cmd += (f" --reps {opts.reps}" if opts.reps else "") + (f" --device {opts.device}" if opts.device != "cpu" else "")
    cmd += " --only " + " ".join(f'"{text}"' for text in opts.only) if opts.only else ""
    return [
        title + (" (quick mode: tiny sizes, not a measurement)" if opts.quick else ""),
        "",
        f"Machine: {machine(opts.device)}.  ",
        f"Command: `{cmd}`, {time.strftime('%Y-%m-%d')}. Medians over {reps} repetition(s), the rows alternating.",
    ]


def write_host(opts, results, not_measured, reps, batch):
    """HOST.md: the medians of the rows measured so far; a row that failed says why, one not run yet says so."""
    lines = [
        *page_head(opts, "host", "# The host side against the games", reps),
        f"Each script's own `train()` at {'tiny' if opts.quick else 'the default'} sizes (a batch of {batch} steps,",
        "the test envs every iteration), its IMPALA CNN replaced by one learned feature vector (the policy ignores",
        "the image) and each update epoch cut to its first minibatch: what is left is what a faster network cannot",
        "remove.",
        "Training steps per second over whole iterations, the first left out; then, in the same process, procgen alone",
        "stepping the same training and test envs for the same steps with random actions; the ratio of the two in",
        "each repetition. The parts are the last iteration's, as the full files log them (`perf/*`).",
        "",
        "| configuration | training steps/s | procgen alone steps/s | ratio | env s | inference s | eval s | update s "
        "|",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in results.items():
        if not rows:
            continue
        med = {key: statistics.median(r.get(key, float("nan")) for r in rows) for key in rows[0]}
        ratio = statistics.median(r["sps"] / r["alone_sps"] for r in rows)
        parts = [f"{med[f'perf/{part}_seconds']:.2f}" if f"perf/{part}_seconds" in med else ""
                 for part in ("env", "inference", "eval", "update")]  # fmt: skip
        lines.append(f"| {name} | {med['sps']:.0f} | {med['alone_sps']:.0f} | {ratio:.2f} | {' | '.join(parts)} |")
    lines += [
        f"| {name} | {not_measured.get(name, NOT_RUN)} |  |  |  |  |  |  |" for name in results if not results[name]
    ]
    (opts.out / "HOST.md").write_text("\n".join([*lines, ""]))
    print(f"wrote {opts.out / 'HOST.md'}")


def write_results(opts, configs, results, done, reps, ceilings, envs, batch, not_measured=None, notes=()):
    """The table (and chart) of the medians over the repetitions measured so far (`done`: the one going on); rows not
    measured yet say so, and rows that failed or timed out say why (`not_measured`: name -> why)."""
    med = {name: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for name, rows in results.items()
           if rows}  # fmt: skip
    base = next(iter(med.values()), None)
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
        "configurations alternate within each repetition. Times are of "
        + (
            f"whole iterations (PPG's with the auxiliary phase each closes), the mean of the last {GPU_TIMED} of "
            f"{GPU_ITERATIONS}"
            if opts.suite == "gpu"
            else "one iteration after a warm-up"
        )
        + ", as the script",
        f"logs them (`perf/*`); a batch is {batch} steps. Ratios are against the first row, measured in the same run.",
        "`run s`: the whole run's seconds (start, compile, every iteration), what a row costs the benchmark.",
        "",
        f"Ceiling, procgen alone ({envs} envs, random actions, no network): "
        + ", ".join(f"{round(v):,} steps/s with {t} thread(s)" for t, v in ceilings.items())
        + ".",
        "",
        "| configuration | steps/s | vs first row | env s | inference s | eval s | update s | PPG aux phase s | peak "
        "RSS GiB | run s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in med.items():
        aux = f"{m.get('aux_per_iteration', m.get('perf/aux_seconds')):.1f}" if "perf/aux_seconds" in m else ""
        lines.append(
            f"| {name} | {m['sps']:.0f} | {m['sps'] / base['sps']:.2f}x | {m['perf/env_seconds']:.2f} | "
            f"{m['perf/inference_seconds']:.2f} | {m['perf/eval_seconds']:.2f} | {m['perf/update_seconds']:.2f} | "
            f"{aux} | {m['peak_rss_gib']:.2f} | {m['row_seconds']:.0f} |"
        )
    why = not_measured or {}  # a row not measured: why (failed, timed out), or not run yet
    lines += [f"| {name} | {why.get(name, NOT_RUN)} |  |  |  |  |  |  |  |  |" for name in results if name not in med]
    lines += ["", *(f"- {note}" for note in notes)] if notes else []
    lines += ["", "![throughput](throughput.png)", ""]
    if opts.suite in ("options", "gpu"):
        title, name = {
            "options": ("The cost of the options", "OPTIONS.md"),
            "gpu": ("The GPU's speed options", "GPU_SPEED.md"),
        }[opts.suite]
        lines[0] = f"# {title}" + (" (quick mode: tiny sizes, not a measurement)" if opts.quick else "")
        (opts.out / name).write_text("\n".join(lines[:-2]))  # no chart
        print(f"wrote {opts.out / name}")
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
