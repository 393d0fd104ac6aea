"""The loop's own cost: what a rollout step costs when the games answer at once and the network does no work.

    python benchmarks/loop_cost.py                        # every row, 3 repetitions: about 10 minutes on 2 CPU cores
    python benchmarks/loop_cost.py --before OLD [OLDER]   # the same rows of older checkouts' scripts, side by side
    python benchmarks/loop_cost.py --quick                # tiny sizes, one repetition: checks that it works

Each row runs the script's own `train()` at the default sizes (64 training envs, 16 test envs every iteration, 256
steps) in a process of its own with one torch thread, with three things swapped out:
  - procgen's games answer at once: preallocated frames, every env's episode ends every 50 steps;
  - the IMPALA CNN is one learned feature vector (the policy ignores the image), and the uint8-to-float conversion is
    left out: on a GPU machine both are the device's work;
  - each update epoch is cut to its first minibatch.
What is left is the Python, the dispatch of small tensor operations, the copies, the wrappers and the bookkeeping
that a GPU machine pays on one core for every step, however fast its games and its GPU. The figure is microseconds
per rollout step: the median iteration (the first two left out: the warm-up and, where compiling, the compiles)
divided by the steps of an iteration; the table gives the median over the repetitions, the rows alternating.
Results go to LOOP.md in --out (this folder; with --quick its quick/ subfolder, git-ignored).
"""

import argparse
import json
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

# (name, script, flags): PPG closes its phase (one auxiliary epoch) after its last timed iteration
FOLDED = ["--rollout", "folded"]
ROWS = [
    ("PPO lean", "ppo_procgen", []),
    ("PPG lean", "ppg_procgen", []),
    ("PPO full, --rollout plain", "ppo_procgen_full", []),
    ("PPO full, --rollout folded", "ppo_procgen_full", ["--rollout", "folded"]),
    ("PPO full, --rollout folded --compile default", "ppo_procgen_full", [*FOLDED, "--compile", "default"]),
    ("PPG full, --rollout folded", "ppg_procgen_full", ["--rollout", "folded"]),
    ("PPG full, --rollout folded --compile default", "ppg_procgen_full", [*FOLDED, "--compile", "default"]),
]  # fmt: skip


class InstantGames:
    """procgen's gym3 interface (`act`, `observe`) answering at once: two preallocated sets of frames in turn, a
    reward of 1 every step, and env i's episode ending at every step t with (t + i) % 50 == 0."""

    def __init__(self, num, rand_seed, **kwargs):
        rng = np.random.default_rng(rand_seed)
        self.frames = rng.integers(0, 256, (2, num, 64, 64, 3), dtype=np.uint8)
        self.reward, self.t = np.ones(num, dtype=np.float32), 0
        self.firsts = (np.arange(50)[:, None] + np.arange(num)[None]) % 50 == 0

    def act(self, actions):
        self.t += 1

    def observe(self):
        return self.reward, {"rgb": self.frames[self.t % 2]}, self.firsts[self.t % 50]


def child(path, flags):
    """The script at `path` through throughput.py's `train_with_tiny_network`, its games answering at once and its
    uint8 frames left unconverted; prints a JSON line of every iteration's seconds."""
    import torch
    from throughput import train_with_tiny_network

    torch.set_num_threads(1)
    seconds = train_with_tiny_network(path, flags, Procgen=InstantGames, preprocess=lambda x: x)[2]
    print(json.dumps(seconds))


def measure(path, flags, iterations, sizes, workdir):
    """One process of `child`: microseconds per rollout step, the median iteration after the first two."""
    steps = int(sizes[sizes.index("--num-steps") + 1]) if "--num-steps" in sizes else 256
    envs = int(sizes[sizes.index("--num-envs") + 1]) if "--num-envs" in sizes else 64
    ppg = Path(path).stem.startswith("ppg")
    extra = ["--n-iteration", str(iterations), "--e-auxiliary", "1"] if ppg else ["--update-epochs", "1"]
    cmd = [sys.executable, __file__, "--child", str(path), "--total-timesteps", str(envs * steps * iterations),
           "--device", "cpu", "--exp-name", "loop", *extra, *sizes, *flags]  # fmt: skip
    with tempfile.TemporaryDirectory(dir=workdir) as cwd:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"loop_cost.py: a run failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    seconds = json.loads(proc.stdout.strip().splitlines()[-1])
    return statistics.median(seconds[2:]) / steps * 1e6


def machine():
    import torch

    cpu = "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    python = f"Python {platform.python_version()}, torch {torch.__version__}"
    return f"{platform.machine()}, {os.cpu_count()} cores ({cpu}), {python}"


def main():
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: a check, not a measurement")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of every row (3; quick: 1)")
    parser.add_argument("--iterations", type=int, default=None, help="iterations of every run (5; quick: 3)")
    parser.add_argument(
        "--before",
        type=Path,
        nargs="+",
        default=[],
        metavar="CHECKOUT",
        help="older checkouts whose scripts run beside these (a column each, named after its folder)",
    )
    parser.add_argument("--out", type=Path, default=None, help="where LOOP.md goes (this folder; quick: its quick/)")
    parser.add_argument("--only", nargs="+", default=None, metavar="TEXT", help="only rows whose names contain one")
    opts = parser.parse_args()
    here = Path(__file__).resolve().parent
    out = (opts.out or (here / "quick" if opts.quick else here)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    reps, iterations = opts.reps or (1 if opts.quick else 3), opts.iterations or (3 if opts.quick else 5)
    sizes = ["--num-envs", "8", "--num-steps", "16", "--num-eval-envs", "4"] if opts.quick else []
    rows = [r for r in ROWS if opts.only is None or any(text in r[0] for text in opts.only)]
    trees = {"after": ROOT, **{path.resolve().name: path.resolve() for path in opts.before}}
    results = {(name, tree): [] for name, *_ in rows for tree in trees}
    for rep in range(reps):  # the rows alternate, so that a shared machine's drift falls on all of them alike
        for name, script, flags in rows:
            for tree, root in trees.items():
                results[name, tree].append(measure(root / f"{script}.py", flags, iterations, sizes, out))
                print(f"rep {rep + 1}/{reps}  {name} ({tree}): {results[name, tree][-1]:.0f} us a step", flush=True)
    cmd = "python benchmarks/loop_cost.py" + (" --quick" if opts.quick else "")
    cmd += " --before " + " ".join(list(trees)[1:]) if opts.before else ""
    lines = [
        "# The loop's own cost" + (" (quick mode: tiny sizes, not a measurement)" if opts.quick else ""),
        "",
        f"Machine: {machine()}.  ",
        f"Command: `{cmd}`, {time.strftime('%Y-%m-%d')}. {reps} repetition(s) of {iterations} iterations, the rows",
        "alternating; one torch thread. Microseconds per rollout step (64 training and 16 test envs at the defaults),",
        "with the games answering at once and the network's work left out (see the module docstring).",
        "",
        "| row | " + " | ".join(f"us a step ({tree})" for tree in trees) + " |",
        "|---|" + "---|" * len(trees),
    ]
    for name, *_ in rows:
        cells = [f"{statistics.median(results[name, t]):.0f}" if results[name, t] else "" for t in trees]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (out / "LOOP.md").write_text("\n".join([*lines, ""]))
    print(f"wrote {out / 'LOOP.md'}")


if __name__ == "__main__":
    main()
