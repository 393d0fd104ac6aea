"""Learning benchmark: train the scripts over games and seeds, then plot and tabulate the returns.

    # the published setup, on a GPU (25M steps, easy, 200 levels; 3 games x 3 seeds x 2 algorithms)
    python benchmarks/learning.py run --env-ids starpilot bossfight bigfish --seeds 1 2 3 --total-timesteps 25000000
    python benchmarks/learning.py report
    # a short check on a CPU, with extra flags passed to the scripts after --
    OMP_NUM_THREADS=1 python benchmarks/learning.py run --scripts ppo_procgen --seeds 1 2 --total-timesteps 204800 \\
        --parallel 2 -- --num-envs 16 --num-steps 256 --num-minibatches 8 --env-threads 1

`run` trains every script x game x seed, each logging to its own TensorBoard directory under `--runs`, at most
`--parallel` at a time, and measures a random policy on the same training levels. `report` reads the events
back and writes `learning.png` (train and held-out test returns against steps: the mean over seeds with a
band of one std, one panel per game, the algorithms on the same axes, the published 25M-step results as
horizontal lines) and `LEARNING.md` (the mean of the last 100 episodes of each run, the number of steps each
run had, and the score normalised by the Procgen paper's easy-mode ranges).
"""

import argparse
import json
import re
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
SCRIPTS = {"ppo_procgen": "PPO", "ppg_procgen": "PPG"}
# Published returns at 25M steps, easy distribution, 3 seeds (test levels): (mean, std)
REFERENCES = {
    "CleanRL PPO": {"starpilot": (30.99, 1.96), "bossfight": (8.85, 0.33), "bigfish": (16.46, 2.71)},
    "CleanRL PPG": {"starpilot": (34.82, 13.77), "bossfight": (10.78, 1.90), "bigfish": (24.23, 10.73)},
    "OpenAI PPG": {"starpilot": (42.01, 9.59), "bossfight": (10.71, 2.05), "bigfish": (15.94, 10.80)},
}
# The Procgen paper's easy-mode score ranges (R_min, R_max) for the normalised score (R - R_min) / (R_max - R_min)
EASY_RANGES = {
    "bigfish": (1, 40), "bossfight": (0.5, 13), "caveflyer": (3.5, 12), "chaser": (0.5, 13), "climber": (2, 12.6),
    "coinrun": (5, 10), "dodgeball": (1.5, 19), "fruitbot": (-1.5, 32.4), "heist": (3.5, 10), "jumper": (3, 10),
    "leaper": (3, 10), "maze": (5, 10), "miner": (1.5, 13), "ninja": (3.5, 10), "plunder": (4.5, 30),
    "starpilot": (2.5, 64),
}  # fmt: skip


def random_policy_return(env_id, episodes=500, seed=1):
    """The mean return of uniformly random actions on the training levels (200, easy), per-env episode quotas."""
    sys.path.insert(0, str(ROOT))
    import gymnasium as gym
    import torch

    from ppo_procgen_full import Args, ProcgenVecEnv, evaluate

    args = Args(env_id=env_id)

    generator = torch.Generator().manual_seed(seed)  # the same actions, hence the same figure, on every call

    class RandomAgent:
        def get_action_and_value(self, obs):
            return (torch.randint(0, 15, (obs.shape[0],), generator=generator),)

    game = dict(env_name=env_id, distribution_mode=args.distribution_mode, num_threads=args.env_threads)
    envs = ProcgenVecEnv(20, seed, num_levels=args.num_levels, start_level=args.start_level, **game)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    returns = evaluate(RandomAgent(), envs, episodes, torch.device("cpu"))
    envs.close()
    return float(np.mean(returns)), float(np.std(returns))


def run(opts, extra):
    opts.runs.mkdir(parents=True, exist_ok=True)
    jobs = [(s, e, seed) for e in opts.env_ids for seed in opts.seeds for s in opts.scripts]
    procs, started = [], time.time()
    for script, env_id, seed in jobs:
        while sum(p.poll() is None for p in procs) >= opts.parallel:
            time.sleep(2)
        cmd = [sys.executable, str(ROOT / f"{script}.py"), "--env-id", env_id, "--seed", str(seed),
               "--total-timesteps", str(opts.total_timesteps), "--exp-name", script, *extra]  # fmt: skip
        log = open(opts.runs / f"{env_id}__{script}__{seed}.log", "w")
        print("start:", " ".join(cmd[1:]), flush=True)
        procs.append(subprocess.Popen(cmd, cwd=opts.runs, stdout=log, stderr=subprocess.STDOUT))
    failed = [" ".join(p.args[1:]) for p in procs if p.wait() != 0]
    baselines = {env_id: random_policy_return(env_id, opts.random_episodes) for env_id in opts.env_ids}
    (opts.runs / "random_policy.json").write_text(json.dumps(baselines, indent=1))
    print(f"done in {(time.time() - started) / 60:.0f} min; random policy: {baselines}")
    if failed:
        raise SystemExit(f"runs failed: {failed}")


def read_runs(runs_dir):
    """{(env_id, script): [per seed: {"steps": n, "train": [(step, r)], "test": [(step, r)]}]}"""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for run_dir in sorted((runs_dir / "runs").iterdir()):
        m = re.fullmatch(r"(\w+?)__(\w+?)__(\d+)__.+", run_dir.name)
        if not m or m.group(2) not in SCRIPTS:
            continue
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        series = {key: [(e.step, e.value) for e in acc.Scalars(f"charts/{tag}")] if f"charts/{tag}" in tags else []
                  for key, tag in (("train", "episodic_return"), ("test", "test_episodic_return"))}  # fmt: skip
        series["steps"] = max((e.step for e in acc.Scalars("charts/SPS")), default=0) if "charts/SPS" in tags else 0
        found.setdefault((m.group(1), m.group(2)), []).append(series)
    return found


def curve(episodes, grid, window=100):
    """The mean of the last `window` episodes that ended at or before each step of `grid` (nan before any)."""
    steps = np.array([s for s, _ in episodes])
    returns = np.array([r for _, r in episodes])
    out = []
    for g in grid:
        done = returns[steps <= g]
        out.append(done[-window:].mean() if len(done) else np.nan)
    return np.array(out)


def last_mean(episodes, window=100):
    return float(np.mean([r for _, r in episodes[-window:]])) if episodes else float("nan")


def report(opts):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = read_runs(opts.runs)
    if not found:
        raise SystemExit(f"no runs of {', '.join(SCRIPTS)} under {opts.runs / 'runs'}")
    baseline_file = opts.runs / "random_policy.json"
    baselines = json.loads(baseline_file.read_text()) if baseline_file.exists() else {}
    games = sorted({env_id for env_id, _ in found})
    fig, axes = plt.subplots(1, len(games), figsize=(6 * len(games), 4), squeeze=False)
    rows = []
    for ax, env_id in zip(axes[0], games, strict=True):
        for script, label in SCRIPTS.items():
            seeds = found.get((env_id, script), [])
            if not seeds:
                continue
            grid = np.linspace(0, max(s["steps"] for s in seeds), 60)
            for key, style in (("train", "-"), ("test", "--")):
                curves = np.array([curve(s[key], grid) for s in seeds if s[key]])
                if len(curves) == 0:
                    continue
                with warnings.catch_warnings():  # the grid's first points may come before any episode
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mean, std = np.nanmean(curves, 0), np.nanstd(curves, 0)
                line = ax.plot(grid, mean, style, label=f"{label} {key} ({len(curves)} seeds)")[0]
                ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.2)
            finals = {key: [last_mean(s[key]) for s in seeds] for key in ("train", "test")}
            lo, hi = EASY_RANGES[env_id]
            norm = [(r - lo) / (hi - lo) for r in finals["test"]]
            rows.append((env_id, label, len(seeds), min(s["steps"] for s in seeds), finals, norm))
        refs = {name: values[env_id][0] for name, values in REFERENCES.items() if env_id in values}
        top = ax.get_ylim()[1]
        for name, value in refs.items():
            if value <= 3 * top:
                ax.axhline(value, linestyle=":", linewidth=1, color="gray")
                ax.annotate(f"{name} @25M", (0, value), fontsize=7, color="gray", va="bottom")
        far = [f"{name} {value:.2f}" for name, value in refs.items() if value > 3 * top]
        if far:  # a short run would be a flat line under them: they are named instead of drawn
            ax.text(0.02, 0.98, "published @25M, above this scale:\n" + "\n".join(far), transform=ax.transAxes,
                    fontsize=7, color="gray", va="top")  # fmt: skip
        if env_id in baselines:
            ax.axhline(baselines[env_id][0], color="black", linewidth=1, label="random policy")
        ax.set_title(env_id)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("episodic return (mean of last 100 episodes)")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(textwrap.fill(opts.title, 90 * len(games)), fontsize=8)
    fig.tight_layout()
    fig.savefig(opts.out / "learning.png", dpi=100)

    fmt = lambda xs: f"{np.mean(xs):.2f} +- {np.std(xs):.2f}"  # noqa: E731
    lines = [f"# Learning: {opts.title}", "", "Mean of the last 100 episodes of each run, mean +- std over seeds;",
             "normalised score = (test return - R_min) / (R_max - R_min), with the Procgen paper's easy-mode ranges.",
             "", "| game | algorithm | seeds | steps per run | train return | test return | normalised test score "
             "| random policy |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for env_id, label, n, steps, finals, norm in rows:
        random_cell = f"{baselines[env_id][0]:.2f}" if env_id in baselines else ""
        lines.append(f"| {env_id} | {label} | {n} | {steps:,} | {fmt(finals['train'])} | {fmt(finals['test'])} | "
                     f"{fmt(norm)} | {random_cell} |")  # fmt: skip
    lines += ["", "Published at 25,000,000 steps (easy, test levels, 3 seeds):", ""]
    lines += [f"- {name}: " + ", ".join(f"{g} {m:.2f} +- {s:.2f}" for g, (m, s) in values.items())
              for name, values in REFERENCES.items()]  # fmt: skip
    lines += ["", "![learning curves](learning.png)", ""]
    (opts.out / "LEARNING.md").write_text("\n".join(lines))
    print(f"wrote {opts.out / 'LEARNING.md'} and {opts.out / 'learning.png'}")


COMPARED = (
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/explained_variance",
)  # fmt: skip (the lean files log no perf/* timers)


def compare(opts):
    """Two runs that differ in one option (same seed, same flags otherwise): their statistics side by side."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = []
    for run_dir in opts.run_dirs:
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        runs.append({tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]})
    a, b = opts.labels
    lines = [f"# {a} against {b}: {opts.title}", "", f"- {a}: `{opts.run_dirs[0].name}`",
             f"- {b}: `{opts.run_dirs[1].name}`", "",
             f"| statistic | mean {a} | mean {b} | {b} - {a} | largest per-iteration difference |",
             "|---|---|---|---|---|"]  # fmt: skip
    for tag in COMPARED:
        if tag not in runs[0] or tag not in runs[1]:
            continue
        by_step = [dict(r[tag]) for r in runs]  # one value per iteration
        steps = sorted(by_step[0].keys() & by_step[1].keys())
        xa, xb = (np.array([d[s] for s in steps]) for d in by_step)
        lines.append(f"| {tag} | {xa.mean():.4g} | {xb.mean():.4g} | {xb.mean() - xa.mean():+.3g} | "
                     f"{np.abs(xb - xa).max():.3g} |")  # fmt: skip
    horizon = min(max((s for s, _ in r.get("charts/SPS", [])), default=np.inf) for r in runs)  # the shorter run
    for tag in ("charts/episodic_return", "charts/test_episodic_return"):
        if tag in runs[0] and tag in runs[1]:
            ra, rb = ([v for s, v in r[tag] if s <= horizon] for r in runs)
            lines.append(f"| {tag} (episodes to step {horizon:,}) | {np.mean(ra):.3g} ({len(ra)}) | "
                         f"{np.mean(rb):.3g} ({len(rb)}) | {np.mean(rb) - np.mean(ra):+.3g} | |")  # fmt: skip
    shown = [t for t in ("losses/approx_kl", "losses/clipfrac") if t in runs[0] and t in runs[1]]
    lines += ["", "Per iteration:", "", "| step | " + " | ".join(f"{t} {x}" for t in shown for x in (a, b)) + " |",
              "|---" * (1 + 2 * len(shown)) + "|"]  # fmt: skip
    by_step = [[dict(r[t]) for r in runs] for t in shown]
    for step in sorted(set.intersection(*(set(d) for pair in by_step for d in pair))) if shown else []:
        lines.append(f"| {step:,} | " + " | ".join(f"{d[step]:.4g}" for pair in by_step for d in pair) + " |")
    opts.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {opts.out}")


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="train every script x game x seed")
    p_run.add_argument("--scripts", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    p_run.add_argument("--env-ids", nargs="+", default=["starpilot"])
    p_run.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    p_run.add_argument("--total-timesteps", type=int, default=25_000_000)
    p_run.add_argument("--parallel", type=int, default=1, help="runs at a time")
    p_run.add_argument("--random-episodes", type=int, default=500, help="episodes of the random-policy baseline")
    p_report = sub.add_parser("report", help="plot and tabulate the runs")
    p_report.add_argument("--out", type=Path, default=HERE, help="where learning.png and LEARNING.md go")
    p_report.add_argument("--title", default="returns against steps", help="what the runs were (machine, steps)")
    for p in (p_run, p_report):
        p.add_argument("--runs", type=Path, default=HERE / "learning_runs", help="the folder holding runs/")
    p_compare = sub.add_parser("compare", help="two runs' statistics side by side (one option changed)")
    p_compare.add_argument("run_dirs", nargs=2, type=Path, help="the two runs' TensorBoard directories")
    p_compare.add_argument("--labels", nargs=2, default=["A", "B"], help="what each run was")
    p_compare.add_argument("--title", default="same seed", help="what the runs were (machine, steps, flags)")
    p_compare.add_argument("--out", type=Path, default=HERE / "COMPARE.md", help="the markdown file written")
    opts = parser.parse_args(argv)
    {"run": lambda: run(opts, extra), "report": lambda: report(opts), "compare": lambda: compare(opts)}[opts.command]()


if __name__ == "__main__":
    main()
