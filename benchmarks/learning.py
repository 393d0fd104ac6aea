"""Learning benchmark: train the scripts over games and seeds, then chart them beside OpenAI's PPO runs at equal steps.

    # on a CPU: PPO at the defaults (64 envs x 256 steps, the reference's sizes) on starpilot, 31 iterations
    OMP_NUM_THREADS=1 python benchmarks/learning.py run --scripts ppo_procgen --seeds 2 --total-timesteps 507904
    python benchmarks/learning.py report --title "what the runs were, the machine"
    # on a GPU: all 16 games, 3 seeds, PPO and PPG, 25M steps each
    python benchmarks/learning.py run --env-ids all --seeds 1 2 3 --total-timesteps 25000000

`run` trains every script x game x seed, each logging to its own TensorBoard directory under `--runs`, at most
`--parallel` at a time, and measures a random policy on the same training levels; flags after `--` go to the scripts.
`report` reads the events back and writes `learning.png` (for each game, the training-level and test-level returns
against steps: the reference runs' range as a band, ours as lines) and `LEARNING.md` (at each run's last step, ours
beside the reference runs' values, the fraction of our logged points inside their range, the last tenth's means, and
the normalised test scores, aggregated over games with rliable's IQM where three or more games ran), and `curves.csv`
(our curves as charted: each run's mean return of the last 100 episodes at every logged step). `compare` sets
two runs' statistics side by side; `phases` tabulates a PPG run phase by phase, beside a PPO run of the same seed.
`campaign` advances the protocol's 25M-step runs (`campaign/plan.json`) by one window of time: it resumes each from its
packed state, stops it at a checkpoint before the window ends, packs it again and reports (`campaign/README.md`).
"""

import argparse
import contextlib
import csv
import datetime
import gzip
import importlib
import importlib.metadata
import io
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import slim_procgen
import throughput
import tyro

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
SCRIPTS = {"ppo_procgen": "PPO", "ppg_procgen": "PPG"}
SCRIPT_OF = {label: script for script, label in SCRIPTS.items()}
# OpenAI's PPO learning curves (train-procgen, easy, 200 levels, 3 runs per game): reference/README.md
REFERENCE = HERE / "reference" / "openai_ppo_easy200.csv.gz"
# The Procgen paper's easy-mode score ranges (R_min, R_max) for the normalised score (R - R_min) / (R_max - R_min).
# train-procgen's constants.py has jumper (1, 10) and leaper (1.5, 10) in its easy table: the paper's hard-mode values.
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

    from plumbing import evaluate
    from ppo_procgen_full import Args, ProcgenVecEnv

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


def check_slimmed(games, what):
    """A procgen packed lighter to travel (slim_procgen.py) draws only its games' backgrounds: any other game would
    learn from other frames than the protocol's, and is refused before anything starts."""
    slimmed = slim_procgen.slim_games()
    other = sorted(set(games) - set(slimmed)) if slimmed is not None else []
    if other:
        raise SystemExit(f"{what}: this procgen is slimmed for {' '.join(slimmed)} (slim_procgen.py): not {other}")


def run(opts, extra):
    check_script_flags(opts.scripts, extra)
    opts.env_ids = list(EASY_RANGES) if opts.env_ids == ["all"] else opts.env_ids
    check_slimmed(opts.env_ids, "run")
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


def read_runs(runs_dirs):
    """{(env_id, script): [per seed: {"logged": [step], "train": [(step, r)], "test": [(step, r)], "seed": seed}]}"""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for run_dir in sorted(
        d for runs_dir in runs_dirs if (runs_dir / "runs").is_dir() for d in (runs_dir / "runs").iterdir()
    ):
        m = re.fullmatch(r"(\w+?)__(\w+?)__(\d+)__.+", run_dir.name)
        if not m or m.group(2) not in SCRIPTS:
            continue
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        series = {key: [(e.step, e.value) for e in acc.Scalars(f"charts/{tag}")] if f"charts/{tag}" in tags else []
                  for key, tag in (("train", "episodic_return"), ("test", "test_episodic_return"))}  # fmt: skip
        series["logged"] = [e.step for e in acc.Scalars("charts/SPS")] if "charts/SPS" in tags else []  # iterations
        series["seed"] = int(m.group(3))
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


def read_reference(path=REFERENCE):
    """OpenAI's PPO runs: {(game, split): [per run: (steps, eprewmean)]}, steps and returns as numpy arrays."""
    rows = {}
    with gzip.open(path, "rt") as f:
        for row in csv.DictReader(f):
            key = (row["game"], row["split"])
            rows.setdefault(key, {}).setdefault(int(row["run"]), []).append((int(row["step"]), float(row["eprewmean"])))
    return {key: [tuple(np.array(v) for v in zip(*sorted(runs[r]), strict=True)) for r in sorted(runs)]
            for key, runs in rows.items()}  # fmt: skip


def logged_steps(run):
    """The steps at which a run of ours closed an iteration: where its `charts/SPS` was logged."""
    return np.array(run["logged"], dtype=float)


def against_reference(seeds, reference, key):
    """Our runs of one game and split beside the reference runs, at the steps where ours were logged.

    Returns the last step common to our seeds, our mean there over seeds, the reference runs' values there (interpolated
    between their logged updates), the fraction of each seed's logged points that lie inside the reference runs'
    range, and the late means: ours over the last tenth of the run, theirs over the same steps."""
    last = min(logged_steps(s)[-1] for s in seeds)
    at = lambda steps: np.array([np.interp(steps, x, y, left=np.nan, right=np.nan) for x, y in reference])  # noqa: E731
    ours_last = [curve(s[key], [last])[0] for s in seeds]
    fractions, above, late_ours, late_ref = [], [], [], []
    for s in seeds:
        steps = logged_steps(s)
        steps = steps[steps <= last]
        ours, ref = curve(s[key], steps), at(steps)
        known = ~np.isnan(ours) & ~np.isnan(ref).any(axis=0)  # a point before any episode, or past the reference
        inside = (ref.min(axis=0) <= ours) & (ours <= ref.max(axis=0))
        fractions.append(inside[known].mean() if known.any() else np.nan)
        above.append((ours > ref.max(axis=0))[known].mean() if known.any() else np.nan)
        late = known & (steps > 0.9 * last)
        late_ours.append(ours[late].mean() if late.any() else np.nan)
        late_ref.append(ref[:, late].mean() if late.any() else np.nan)
    return dict(last=int(last), ours=float(np.mean(ours_last)), ref=at([last])[:, 0], fractions=fractions, above=above,
                late_ours=float(np.nanmean(late_ours)), late_ref=float(np.nanmean(late_ref)))  # fmt: skip


def normalised(env_id, value):
    """A test return as the Procgen paper's normalised score, (R - R_min) / (R_max - R_min) with its easy range."""
    low, high = EASY_RANGES[env_id]
    return (value - low) / (high - low)


def iqm_with_ci(scores, seed=0):
    """Interquartile mean over runs x games, with a 95% stratified-bootstrap interval (rliable)."""
    try:
        from rliable import library as rly
        from rliable import metrics
    except ImportError:
        raise SystemExit("the aggregate over games needs rliable: pip install rliable") from None
    iqm = lambda x: np.array([metrics.aggregate_iqm(x)])  # noqa: E731
    saved = np.random.get_state()  # rliable resamples with numpy's global generator: seeded here, then put back,
    np.random.seed(seed)  # so that the same runs give the same interval on every report
    try:
        with warnings.catch_warnings():  # arch, under rliable, deprecates the RandomState that rliable passes it
            warnings.simplefilter("ignore", FutureWarning)
            state = np.random.RandomState(seed)
            points, intervals = rly.get_interval_estimates({"x": scores}, iqm, reps=2000, random_state=state)
    finally:
        np.random.set_state(saved)
    return float(points["x"][0]), tuple(float(v) for v in intervals["x"][:, 0])


TABLE_INTRO = """Every return here, ours and the reference's, is the mean of the last 100 finished episodes at a logged
step, as baselines logs `eprewmean`. The reference is the Procgen paper's own PPO (baselines' PPO2, easy, 200 training
levels, 64 envs x 256 steps, 3 runs per game; `reference/README.md`), read at our steps by linear interpolation
between its logged updates.

- *at the last step*: our mean over seeds, and the three reference runs at the same step, with their range;
- *points inside*: per seed, the fraction of our logged points that lie inside the reference runs' range (and above
  it; the rest lie below). A fourth run
  drawn from the reference's own distribution lies inside the range of three at a given step with probability 1/2,
  so about 50% is what a faithful reproduction gives; far below it, ours differs;
- *last tenth*: our mean over the logged points in the run's last tenth of steps, against the reference runs' mean
  over the same steps.

| game | algorithm | levels | seeds | last step | ours | reference runs | inside? | points inside | last tenth: ours \
| last tenth: reference |
|---|---|---|---|---|---|---|---|---|---|---|"""
# CleanRL's published returns at 25M steps, easy, 3 seeds each (mean +- std over them): ppo_procgen.py from its
# docs/rl-algorithms/ppo.md (vwxyzjn/cleanrl at 7a96de2), ppg_procgen.py from docs/rl-algorithms/ppg.md (at f315b7c)
CLEANRL_25M = {
    "PPO": {"starpilot": (30.99, 1.96), "bossfight": (8.85, 0.33), "bigfish": (16.46, 2.71)},
    "PPG": {"starpilot": (34.82, 13.77), "bossfight": (10.78, 1.90), "bigfish": (24.23, 10.73)},
}
CLEANRL_INTRO = """CleanRL's published returns at 25M steps (its docs; 3 seeds each, mean +- std), beside ours at the
step each run reached. The setup differs: CleanRL's scripts train on all levels (`num_levels=0`), so theirs is the
return on the whole level distribution of a policy that trained on all of it, ours a policy that trained on 200 (its
test return is on the whole distribution). Only at 25M are the steps the same. Its PPG page gives other runs of its
PPO beside them: starpilot 32.47 +- 11.21, bossfight 9.63 +- 2.35, bigfish 16.80 +- 9.49.

| game | algorithm | our last step | ours: training levels | ours: test levels | CleanRL at 25M (all levels) |
|---|---|---|---|---|---|"""
NORMALISED_INTRO = """Normalised test score (R - R_min) / (R_max - R_min) at the last step, with the Procgen paper's
easy-mode ranges (jumper and leaper (3, 10); train-procgen's `constants.py` has (1, 10) and (1.5, 10) there, the
paper's hard-mode values):
"""


def report(opts):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = read_runs(opts.runs)
    baselines = {}  # the random policy's return per game, from the first folder that measured it
    for runs_dir in reversed(opts.runs):
        if (runs_dir / "random_policy.json").exists():
            baselines |= json.loads((runs_dir / "random_policy.json").read_text())
    if not found:
        raise SystemExit(f"no runs of {', '.join(SCRIPTS)} under {' or '.join(str(d / 'runs') for d in opts.runs)}")
    reference = read_reference(opts.reference)
    opts.out.mkdir(parents=True, exist_ok=True)
    games = sorted({env_id for env_id, _ in found})
    cols = min(len(games), 4)  # four games a row, each a column of two charts (training levels over test levels)
    lines_of_games = -(-len(games) // cols)
    fig, axes = plt.subplots(2 * lines_of_games, cols, figsize=(6 * cols, 4 * 2 * lines_of_games), squeeze=False)
    for empty in range(len(games), lines_of_games * cols):  # the last line's places left over
        axes[2 * (empty // cols)][empty % cols].set_visible(False)
        axes[2 * (empty // cols) + 1][empty % cols].set_visible(False)
    rows, colours = [], {"PPO": "tab:blue", "PPG": "tab:red"}
    for place, env_id in enumerate(games):
        horizon = max(logged_steps(s)[-1] for (g, _), seeds in found.items() if g == env_id for s in seeds)
        for row, key in enumerate(("train", "test")):
            ax = axes[2 * (place // cols) + row][place % cols]
            ref = reference.get((env_id, key), [])
            if ref:  # the reference runs as a band (their range) around their mean, up to a little past ours
                grid = ref[0][0][ref[0][0] <= horizon * 1.1]
                values = np.array([np.interp(grid, x, y) for x, y in ref])
                ax.fill_between(grid, values.min(0), values.max(0), color="gray", alpha=0.3,
                                label=f"OpenAI PPO, range of {len(ref)} runs")  # fmt: skip
                ax.plot(grid, values.mean(0), color="gray", linewidth=1)
            for script, label in SCRIPTS.items():
                seeds = [s for s in found.get((env_id, script), []) if s[key]]
                name = f"ours, {label} ({len(seeds)} seed{'s' * (len(seeds) > 1)})"
                for i, s in enumerate(seeds):
                    steps = logged_steps(s)
                    ax.plot(steps, curve(s[key], steps), color=colours[label], label=None if i else name)
                if seeds and ref:
                    rows.append((env_id, label, key, len(seeds), against_reference(seeds, ref, key)))
            if env_id in baselines and key == "train":
                ax.axhline(baselines[env_id][0], color="black", linewidth=0.8, linestyle=":", label="random policy")
            ax.set_xlim(0, horizon * 1.1)
            ax.set_title(f"{env_id}, {'training levels' if key == 'train' else 'test levels (all)'}")
            ax.set_xlabel("environment steps")
            ax.set_ylabel("mean return of the last 100 episodes")
            ax.legend(fontsize=7, loc="upper left")
    title = fig.suptitle(textwrap.fill(opts.title, 90 * cols), fontsize=8)
    fig.canvas.draw()  # the title's height is known once drawn: the charts keep below it
    fig.tight_layout(rect=(0, 0, 1, title.get_window_extent().y0 / fig.bbox.height))
    fig.savefig(opts.out / "learning.png", dpi=100)

    with open(opts.out / "curves.csv", "w", newline="") as f:  # what the chart draws of ours, to chart or test again
        table = csv.writer(f)
        table.writerow(["game", "algorithm", "seed", "step", "train", "test"])
        for (env_id, script), seeds in sorted(found.items()):
            for s in seeds:
                steps = logged_steps(s)
                for step, *returns in zip(steps, curve(s["train"], steps), curve(s["test"], steps), strict=True):
                    cells = [f"{v:.4f}" if np.isfinite(v) else "" for v in returns]
                    table.writerow([env_id, SCRIPTS[script], s["seed"], int(step), *cells])

    lines = [f"# Learning beside OpenAI's PPO runs: {opts.title}", "", TABLE_INTRO]
    for env_id, label, key, n, r in rows:
        lo, hi = np.nanmin(r["ref"]), np.nanmax(r["ref"])
        inside = "yes" if lo <= r["ours"] <= hi else ("below" if r["ours"] < lo else "above")
        runs = ", ".join(f"{v:.2f}" for v in r["ref"])
        fractions = ", ".join(f"{f:.0%} ({a:.0%} above)" for f, a in zip(r["fractions"], r["above"], strict=True))
        lines.append(f"| {env_id} | {label} | {key} | {n} | {r['last']:,} | {r['ours']:.2f} | {runs} ({lo:.2f} to "
                     f"{hi:.2f}) | {inside} | {fractions} | {r['late_ours']:.2f} | {r['late_ref']:.2f} |")  # fmt: skip

    our_scores, at_same_steps = {}, {}  # algorithm -> game -> per seed (ours) or per reference run, normalised
    for env_id, label, key, _, r in rows:
        if key == "test":
            finals = [curve(s["test"], [r["last"]])[0] for s in found[(env_id, SCRIPT_OF[label])] if s["test"]]
            our_scores.setdefault(label, {})[env_id] = [normalised(env_id, v) for v in finals]
            at_same_steps.setdefault(label, {})[env_id] = [normalised(env_id, v) for v in r["ref"] if np.isfinite(v)]
    lines += ["", NORMALISED_INTRO]
    for label, per_game in our_scores.items():
        # ours, then the reference runs at each game's same last step: runs x games, the runs each game has in common
        for name, scores in ((label, per_game), (f"OpenAI's PPO beside {label}", at_same_steps[label])):
            lines.append(f"- {name}: " + ", ".join(f"{g} {np.mean(v):.3f}" for g, v in scores.items()))
            common = min(len(v) for v in scores.values())
            if len(scores) >= 3 and common > 0:
                iqm, (low, high) = iqm_with_ci(np.array([v[:common] for v in scores.values()]).T)
                lines[-1] += f"; IQM over {len(scores)} games {iqm:.3f} " + (
                    f"(95% CI {low:.3f} to {high:.3f}, rliable)" if common > 1 else "(one run a game: no interval)"
                )  # the bootstrap resamples runs within a game: with one, its interval is the point itself
    ours = {(env_id, label, key): r for env_id, label, key, _, r in rows}  # at the last step: the mean over seeds
    published = [(g, label) for label, games in CLEANRL_25M.items() for g in games if (g, label, "train") in ours]
    lines += ["", CLEANRL_INTRO] if published else []
    for env_id, label in published:
        train, test = ours[env_id, label, "train"], ours.get((env_id, label, "test"))
        mean, std = CLEANRL_25M[label][env_id]
        test = f"{test['ours']:.2f}" if test else "-"
        lines.append(
            f"| {env_id} | {label} | {train['last']:,} | {train['ours']:.2f} | {test} | {mean:.2f} +- {std:.2f} |"
        )
    if baselines:
        lines += ["", "Random policy on the training levels (mean of 500 episodes): "
                  + ", ".join(f"{g} {v[0]:.2f}" for g, v in baselines.items())]  # fmt: skip
    lines += ["", "![learning curves](learning.png)", ""]
    (opts.out / "LEARNING.md").write_text("\n".join(lines))
    print(f"wrote {opts.out / 'LEARNING.md'}, {opts.out / 'learning.png'} and {opts.out / 'curves.csv'}")


COMPARED = (
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/explained_variance",
)  # fmt: skip (the lean files log no perf/* timers)


def scalars(run_dir):
    """{tag: [(step, value), ...]} of every scalar a run logged (all its event files: a resumed run has several)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def compare(opts):
    """Two runs that differ in one option (same seed, same flags otherwise): their statistics side by side."""
    runs = [scalars(run_dir) for run_dir in opts.run_dirs]
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


def phases(opts):
    """PPG phase by phase: at each phase's end (where its auxiliary losses are logged), those losses; the mean
    approx_kl of the `--window` policy iterations before the auxiliary phase and of those after it; for the training
    and the test levels the mean return of the episodes that ended in those iterations, the means of the last 100
    episodes at the phase's end, and the reference runs' range. PPO's figures are at the same steps."""
    ppg = scalars(opts.ppg)
    ppo = scalars(opts.ppo) if opts.ppo else {}
    game = opts.ppg.name.split("__")[0]
    reference = read_reference(opts.reference)
    logged = [step for step, _ in ppg["charts/SPS"]]  # the iterations' ends
    batch = logged[0]  # the first iteration's end is one batch of steps
    ppo_last = max((step for step, _ in ppo.get("charts/SPS", [])), default=-1)
    tag = {"train": "charts/episodic_return", "test": "charts/test_episodic_return"}
    aux = {key: dict(ppg.get(f"losses/aux/{key}", [])) for key in ("kl_loss", "aux_value_loss", "real_value_loss")}
    span = opts.window * batch  # the steps of `--window` iterations
    kl = [dict(run.get("losses/approx_kl", [])) for run in (ppg, ppo)]

    def window(episodes, start, end):  # the mean return of the episodes that ended in (start, end]
        returns = [r for step, r in episodes if start < step <= end]
        return f"{np.mean(returns):.2f} ({len(returns)})" if returns else "-"

    def windows(levels, start, end):  # PPG's and PPO's `window`s, where the run went that far
        cells = ["-" if tag[levels] not in run else window(run[tag[levels]], start, end) if end <= last else "not run"
                 for run, last in ((ppg, logged[-1]), (ppo, ppo_last))]  # fmt: skip
        return " / ".join(cells)

    def mean_kl(end):  # PPG's and PPO's mean approx_kl of the iterations before and after `end`, where all ran
        pairs = [[np.mean([v for s, v in k.items() if a < s <= b]) if b <= max(k, default=0) else np.nan
                  for a, b in ((end - span, end), (end, end + span))] for k in kl]  # fmt: skip
        return [" / ".join("-" if np.isnan(m) else f"{m:.4f}" for m in pair) for pair in pairs]

    lines = [f"# PPG phase by phase: {opts.title}", "", f"- PPG: `{opts.ppg.name}`"]
    lines += [f"- PPO: `{opts.ppo.name}`" if opts.ppo else "- PPO: none given", ""]
    its = "iteration" if opts.window == 1 else f"{opts.window} iterations"
    lines += [f"| phase | step | kl_loss | aux_value_loss | real_value_loss | approx_kl, {its} before / after: PPG | "
              f"PPO | levels | {its} before: PPG / PPO (episodes) | {its} after: PPG / PPO | last 100: PPG | PPO | "
              "reference runs |", "|---" * 13 + "|"]  # fmt: skip
    for phase, end in enumerate(sorted(aux["kl_loss"]), 1):
        losses = " | ".join(f"{aux[key][end]:.4f}" for key in aux) + " | " + " | ".join(mean_kl(end))
        for levels in ("train", "test"):
            ours = ppg.get(tag[levels], [])
            ppo_here = f"{curve(ppo[tag[levels]], [end])[0]:.2f}" if tag[levels] in ppo and end <= ppo_last else "-"
            ref = [np.interp(end, x, y, left=np.nan, right=np.nan) for x, y in reference.get((game, levels), [])]
            ref_text = f"{min(ref):.2f} to {max(ref):.2f}" if ref and not np.isnan(ref).any() else "-"
            lines.append(f"| {phase} | {end:,} | {losses} | {levels} | {windows(levels, end - span, end)} | "
                         f"{windows(levels, end, end + span)} | "
                         f"{curve(ours, [end])[0]:.2f} | {ppo_here} | {ref_text} |")  # fmt: skip
    opts.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {opts.out}")


# ── campaign: the protocol's long runs, each advanced a chunk at a time by whatever window of time there is ──
PLAN = HERE / "campaign" / "plan.json"
# a full file's console line after an iteration: the iteration, of how many, the step
ITERATION_LINE = re.compile(r"^iter (\d+)/(\d+)  step (\d+)  SPS \d+  \(([\d.]+)s/iter", re.M)
PHASE_LINE = re.compile(r"^phase \d+/\d+  ", re.M)  # a PPG run's, at its auxiliary phase's end
# inductor's cache of the runs' compiled stages (and Triton's kernels), packed with the runs: a window on a new machine
# loads them where it would compile them afresh (one CPU run's first iteration: 42 s cold, 6 s from a cache copied to
# another folder; 4.6 MB, 0.25 MB packed)
COMPILE_CACHE = "compile_cache"
WORK = HERE / "campaign_work"  # the runs unpacked, and the compile cache (`--work`'s default)


def cache_env(cache):
    """The environment that points inductor's cache, and Triton's kernels in it, at `cache`."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}


def plan_runs(path):
    """The plan's runs in order, by key: each a dict of script (a full file: the runs resume), env_id, seed,
    total_timesteps, flags (default none), name (its `--exp-name`, default the lean file's name, as the report groups
    runs) and group (the report's folder, default `defaults`: one folder a setup). The key names the run's folder."""
    out = {}
    for i, entry in enumerate(json.loads(Path(path).read_text())["runs"]):
        missing = {"script", "env_id", "seed", "total_timesteps"} - entry.keys()
        if missing or not entry["script"].endswith("_full"):
            raise SystemExit(
                f"--plan: run {i} needs {sorted(missing)}"
                if missing
                else f"--plan: run {i}: {entry['script']} is not a full file, which a chunk could not resume"
            )
        run = {"flags": [], "name": entry["script"].removesuffix("_full"), "group": "defaults", **entry}
        group = "" if run["group"] == "defaults" else f"__{run['group']}"
        key = f"{run['env_id']}__{run['name']}__{run['seed']}{group}"
        if key in out:
            raise SystemExit(f"--plan: {key} comes twice")
        out[key] = run
    return out


def stops_at_phase_end(run):
    """Whether the run is PPG's, which the campaign stops at a phase's end: a checkpoint inside a phase holds its
    rollouts (up to 6.25 GiB at the default sizes), which cannot travel; after the phase it holds none (18.7 MB)."""
    return run["script"].startswith("ppg")


def read_status(run_dir):
    """A run's progress as the campaign keeps it in `campaign.json` beside its `runs/`."""
    path = run_dir / "campaign.json"
    blank = {"done": False, "iteration": 0, "iterations": None, "step": 0, "chunks": 0, "notes": []}
    return {**blank, **json.loads(path.read_text())} if path.exists() else blank


def newest_checkpoint(run_dir):
    """The newest `iter_*.pt` of the run (not one set aside by a resume, nor a diverged run's diagnostic one)."""
    found = sorted(run_dir.glob("runs/*/checkpoints/iter_*.pt"))
    return found[-1] if found else None


# A run's events travel folded: one event per episode made a run's state grow by 0.13 to 0.19 MB packed a million
# steps, which at 25M steps would leave room for three runs in what a window takes, not four
HISTORY = "history.npz"  # in a packed run directory, in place of its event files
HISTORY_EVENTS = "events.out.tfevents.0000000000.history"  # unpacked: its name sorts before the run's own files


def fold_events(run_dir):
    """The run's events as TensorBoard reads them (a resume's purge applied), in arrays: each scalar tag's steps,
    values and wall times (to the millisecond), as deltas, and the text events whole; None (kept as they are) where
    the run logged more kinds. Packed, 4.6 times smaller than the event files (starpilot's first 1.26M steps: 36 KB,
    not 164), in which every event repeats its tag and carries two checksums."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    kinds = acc.Tags()
    if any(found for kind, found in kinds.items() if kind not in ("scalars", "tensors")):
        return None
    series = [acc.Scalars(tag) for tag in kinds["scalars"]]
    events = [e for one in series for e in one]
    start = min((e.wall_time for e in events), default=0.0)
    texts = []  # the hyperparameters' table at each start (TensorBoard's text plugin, as its metadata says)
    for tag in kinds["tensors"]:
        metadata = acc.SummaryMetadata(tag).SerializeToString().hex()
        for e in acc.Tensors(tag):
            tensor = e.tensor_proto.SerializeToString().hex()
            texts.append({"tag": tag, "step": e.step, "wall_time": e.wall_time, "tensor": tensor, "metadata": metadata})
    meta = json.dumps({"tags": kinds["scalars"], "start": start, "texts": texts})
    return {
        "meta": np.frombuffer(meta.encode(), dtype=np.uint8),
        "counts": np.array([len(one) for one in series], dtype=np.int64),
        "steps": np.diff(np.array([e.step for e in events], dtype=np.int64), prepend=0),
        "values": np.array([e.value for e in events], dtype=np.float32),
        "wall_ms": np.diff(np.round([(e.wall_time - start) * 1000 for e in events]).astype(np.int64), prepend=0),
    }


def unfold_events(run_dir):
    """`run_dir/history.npz` as an event file again (`HISTORY_EVENTS`, read before the run's own files), in the order
    of their steps and wall times; the values that share both (an episode's return and length) in one event."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.summary.writer.record_writer import RecordWriter

    with np.load(run_dir / HISTORY) as folded:
        meta = json.loads(folded["meta"].tobytes())
        tags = np.repeat(np.arange(len(meta["tags"])), folded["counts"])
        steps, values = np.cumsum(folded["steps"]), folded["values"]
        walls = meta["start"] + np.cumsum(folded["wall_ms"]) / 1000
    with open(run_dir / HISTORY_EVENTS, "wb") as f:
        writer = RecordWriter(f)
        writer.write(Event(wall_time=meta["start"], file_version="brain.Event:2").SerializeToString())
        for text in meta["texts"]:
            metadata = SummaryMetadata.FromString(bytes.fromhex(text["metadata"]))
            value = Summary.Value(
                tag=text["tag"], metadata=metadata, tensor=TensorProto.FromString(bytes.fromhex(text["tensor"]))
            )
            event = Event(wall_time=text["wall_time"], step=text["step"], summary=Summary(value=[value]))
            writer.write(event.SerializeToString())
        order = np.lexsort((walls, steps))  # as they were written, each tag's events in their own order
        for _, group in itertools.groupby(order, key=lambda i: (steps[i], walls[i])):
            group = list(group)
            summary = Summary(value=[Summary.Value(tag=meta["tags"][tags[i]], simple_value=values[i]) for i in group])
            writer.write(
                Event(wall_time=walls[group[0]], step=int(steps[group[0]]), summary=summary).SerializeToString()
            )
    (run_dir / HISTORY).unlink()


def pack(work, state, key, part_bytes):
    """The run's folder (or the compile cache's), with its newest checkpoint alone (none once the run is done) and its
    events folded (`fold_events`), xz-packed into `state` as `key.tar.xz.NNNofMMM`, parts of at most `part_bytes`;
    the earlier parts go once the new ones are written."""
    newest = None if read_status(work / key)["done"] else newest_checkpoint(work / key)
    folded = {} if key == COMPILE_CACHE else {d: fold_events(d) for d in sorted((work / key).glob("runs/*/"))}
    folded = {run_dir: arrays for run_dir, arrays in folded.items() if arrays is not None}

    def kept(info):
        path = Path(info.name)
        dropped = "checkpoints" in path.parts and info.isfile() and (newest is None or path.name != newest.name)
        events = work / path.parent in folded and (".tfevents." in path.name or path.name == HISTORY)
        return None if dropped or events or path.name == "lock" else info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        tar.add(work / key, arcname=key, filter=kept)
        for run_dir, arrays in folded.items():
            data = io.BytesIO()
            np.savez(data, **arrays)
            info = tarfile.TarInfo(str((run_dir / HISTORY).relative_to(work)))
            info.size, info.mtime = len(data.getvalue()), int(time.time())
            tar.addfile(info, io.BytesIO(data.getvalue()))
    data = buffer.getvalue()
    temporary = state / f".{key}.new"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    starts = range(0, len(data), part_bytes)
    for n, start in enumerate(starts):  # each part says how many there are: a set mixed with another's is refused
        (temporary / f"{key}.tar.xz.{n + 1:03d}of{len(starts):03d}").write_bytes(data[start : start + part_bytes])
    for old in state.glob(f"{key}.tar.xz.*"):
        old.unlink()
    for new in temporary.iterdir():
        new.replace(state / new.name)
    temporary.rmdir()
    return len(data)


def unpack(state, work):
    """Each run packed in `state` into `work/<key>`, unless the folder there went further (the same machine, whose
    newer work did not travel back); the compile cache's files added to `work`'s."""
    parts = {}
    for path in sorted(state.glob("*.tar.xz.[0-9][0-9][0-9]of[0-9][0-9][0-9]")):
        parts.setdefault(path.name.rsplit(".tar.xz.", 1)[0], []).append(path)
    for key, files in parts.items():
        if [f.name[-8:] for f in files] != [f"{n:03d}of{len(files):03d}" for n in range(1, len(files) + 1)]:
            raise SystemExit(f"campaign: {state}: the parts of {key} are not one whole set: {[f.name for f in files]}")
        with tarfile.open(fileobj=io.BytesIO(b"".join(f.read_bytes() for f in files)), mode="r:xz") as tar:
            if key == COMPILE_CACHE:  # joins what this machine's cache has
                tar.extractall(work, filter="data")
                continue
            packed = json.load(tar.extractfile(f"{key}/campaign.json"))
            if read_status(work / key)["iteration"] > packed["iteration"]:
                print(f"campaign: {key}: {work / key} is further on than {state}; it goes on from there", flush=True)
                continue
            shutil.rmtree(work / key, ignore_errors=True)
            tar.extractall(work, filter="data")
        for run_dir in (work / key).glob(f"runs/*/{HISTORY}"):
            unfold_events(run_dir.parent)


class Chunk:
    """One run's process in this window: its log, read as it grows for the iterations it closes."""

    def __init__(self, key, run, work, extra, checkpoint_interval, env):
        self.key, self.dir, self.status = key, work / key, read_status(work / key)
        self.dir.mkdir(parents=True, exist_ok=True)
        ckpt = newest_checkpoint(self.dir)
        if ckpt is None and (self.status["iteration"] or (self.dir / "runs").exists()):
            note = f"its checkpoint is lost: starts afresh (its {self.status['step']:,} steps logged are dropped)"
            print(f"campaign: {key}: {note}", flush=True)
            self.status["notes"].append(note)
            shutil.rmtree(self.dir / "runs", ignore_errors=True)
            self.status.update(iteration=0, step=0)
        if ckpt is not None:  # its flags are the checkpoint's (`--resume` makes them the defaults)
            flags = ["--resume", str(ckpt.parent.parent.relative_to(self.dir))]
        else:
            flags = [
                "--env-id",
                run["env_id"],
                "--seed",
                str(run["seed"]),
                "--total-timesteps",
                str(run["total_timesteps"]),
                "--exp-name",
                run["name"],
                "--checkpoint-interval",
                str(checkpoint_interval),
                "--keep-checkpoints",
                "2",
                *run["flags"],
            ]
        flags += ["--stop-at-phase-end"] if stops_at_phase_end(run) else []
        cmd = [sys.executable, str(ROOT / f"{run['script']}.py"), *flags, *extra]
        self.log = self.dir / "log.txt"
        with open(self.log, "a") as log:
            # the command as run from the checkout: no path of the machine travels in the packed log
            log.write(
                f"\n# campaign, chunk {self.status['chunks'] + 1}: python {run['script']}.py {' '.join(cmd[2:])}\n"
            )
        self.offset, self.iterations, self.signalled, self.peak_kib = self.log.stat().st_size, 0, None, 0
        self.timed, self.at_once = [], 1  # (step, when read) of each iteration; the most runs seen going at once
        self.began, self.from_step, self.seconds = time.time(), kept_steps(self.status), []  # [console's s/iter]
        self.phase_ends = [time.time()]  # its start (at a phase's start: resumed at a phase's end), each phase line's
        print(f"campaign: {key}: " + ("resumes from " + str(ckpt) if ckpt else "starts"), flush=True)
        # a session of its own: a Ctrl-C at the terminal reaches the campaign, which stops each run with a checkpoint
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )

    def read(self):
        """The iterations the run closed since the last read (its console lines), and its peak resident memory so far
        (the kernel's VmHWM, read at each of the campaign's looks: a run the kernel kills for memory leaves it too)."""
        with contextlib.suppress(OSError):  # gone: the last look's figure stands
            found = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{self.proc.pid}/status").read_text(), re.M)
            self.peak_kib = max(self.peak_kib, int(found[1]) if found else 0)
        with open(self.log) as f:
            f.seek(self.offset)
            text = f.read()
        text = text[: text.rfind("\n") + 1]  # whole lines only
        self.offset += len(text.encode())
        now = time.time()
        for iteration, iterations, step, seconds in ITERATION_LINE.findall(text):
            self.iterations += 1
            self.seconds.append(float(seconds))
            self.timed.append((int(step), now))
            self.status.update(logged_iteration=int(iteration), iterations=int(iterations), step=int(step))
        phases = len(PHASE_LINE.findall(text))
        self.phase_ends += [now] * phases
        if phases and self.timed:  # a PPG chunk's pace runs to its last auxiliary phase's end, which ends it
            self.timed.append((self.timed[-1][0], now))

    def phase_seconds(self):
        """A PPG run's last whole phase on the clock, its policy iterations and auxiliary epochs (the first with the
        run's start and compiling; 0 before its end): how long before the budget's end it must be asked to stop to
        reach its phase's end."""
        return self.phase_ends[-1] - self.phase_ends[-2] if len(self.phase_ends) > 1 else 0.0

    def speed(self):
        """The chunk's steps per second on the clock, from its first iteration's end (the first compiles) to its last's,
        or to its last auxiliary phase's end after it: PPG's auxiliary phases and the checkpoints in it, which an
        iteration's own seconds leave out (the console's s/iter is the policy iteration's); None with fewer than two
        iterations."""
        if len(self.timed) < 2 or self.timed[-1][1] <= self.timed[0][1]:
            return None
        (first, start), (last, end) = self.timed[0], self.timed[-1]
        return round((last - first) / (end - start))

    def signal(self, signum):
        """SIGTERM to the run (its handler finishes the iteration and writes a checkpoint); SIGKILL to the run and
        every process it started (inductor's compile workers)."""
        if self.signalled != signum and self.proc.poll() is None:
            if signum == signal.SIGKILL:
                os.killpg(self.proc.pid, signum)
            else:
                self.proc.send_signal(signum)
            self.signalled = signum

    def close(self, window):
        """The chunk's outcome in the run's status: done (exit status 0), stopped at a checkpoint, or failed; and its
        record in the run's `chunks_run`, with the `window`'s machine, torch and budget."""
        self.read()
        code, status = self.proc.returncode, self.status
        status["chunks"] += 1
        pace = self.speed()
        if pace is not None:  # what one window measured: a run's pace with this many going at once
            status["speed"] = {"chunk": status["chunks"], "steps_per_second": pace, "runs_at_once": self.at_once}
        peak, machine = f"{self.peak_kib / 2**20:.1f} GiB", f"{machine_memory() / 2**30:.1f} GiB"
        if self.peak_kib:  # what the window measured: the run's peak resident memory on its machine
            status["memory"] = {"chunk": status["chunks"], "peak": peak, "of": machine}
        ckpt = newest_checkpoint(self.dir)
        status["iteration"] = int(re.match(r"iter_(\d+)", ckpt.name)[1]) if ckpt else 0
        failed = code not in (0, 128 + signal.SIGTERM, -signal.SIGKILL)
        if code == 0:
            status.update(done=True, iteration=status["iterations"] or status["iteration"])
        elif code == -signal.SIGKILL:
            by = ""  # the campaign's own SIGKILL, too late for a checkpoint; another's (the kernel's out of memory)
            if self.signalled != signal.SIGKILL:
                by = f" by a SIGKILL the campaign did not send ({peak} resident at the last look, of the machine's "
                by += f"{machine}: near it, the kernel's out-of-memory killer)"
            status["notes"].append(
                f"chunk {status['chunks']} killed before its checkpoint{by}: goes on from iteration "
                f"{status['iteration']}"
            )
        elif failed:
            status["notes"].append(f"chunk {status['chunks']} ended with exit status {code} (see log.txt)")
            print(
                f"campaign: {self.key}: exit status {code}; the end of {self.log}:\n"
                + "".join(self.log.read_text().splitlines(True)[-15:]),
                flush=True,
            )
        how = "done" if code == 0 else "stopped at a checkpoint" if code == 128 + signal.SIGTERM else "killed"
        s = sorted(self.seconds)
        record = {"chunk": status["chunks"], **window, "runs_at_once": self.at_once, "iterations": self.iterations}
        record.update(
            began=utc(self.began),
            ended=utc(time.time()),
            steps=[self.from_step, kept_steps(status)],  # those its checkpoint keeps, before and after
            seconds_per_iteration=[s[(len(s) - 1) // 2], s[0], s[-1]] if s else None,  # the console's: median, range
            steps_per_second=pace,
            peak=peak if self.peak_kib else None,
            how=f"exit status {code}" if failed else how,
        )
        status.setdefault("chunks_run", []).append(record)  # from 2026-12-03: earlier chunks have no record
        (self.dir / "campaign.json").write_text(json.dumps(status, indent=1))
        return failed


def utc(seconds):
    """A time in seconds since 1970 as a chunk's record says it, to the minute, in UTC."""
    return (datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M")


def kept_steps(status):
    """The steps a run's newest checkpoint keeps: a run killed after it logged steps that its next chunk runs again."""
    s = status
    return s["iteration"] * s["step"] // s["logged_iteration"] if s.get("logged_iteration") else s["step"]


def machine_name():
    """This machine as a chunk's record names it: its GPUs (the NVIDIA driver's names: the runs' device where there is
    one), the cores this process may use and the CPU's model, with its family and model numbers."""
    cpu, gpus = {}, []
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            cpu.setdefault(key.strip(), value.strip())
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        with contextlib.suppress(OSError, TypeError):
            gpus.append(re.search(r"^Model:\s+(.+)$", info.read_text(), re.M)[1].strip())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    name = f"{cores}-core {cpu.get('model name') or os.uname().machine}"
    name += f" (family {cpu['cpu family']} model {cpu['model']})" if "cpu family" in cpu and "model" in cpu else ""
    return (f"{len(gpus)} x {gpus[0]}; " if gpus else "") + name


def machine_memory():
    """This machine's memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def campaign(opts, extra):
    """Start or resume every unfinished run of the plan, `--parallel` at a time, stop each with SIGTERM `--margin`
    seconds before the budget ends (it finishes its iteration and writes a checkpoint), then pack each run's state and
    write the report at the steps the runs reached."""
    deadline = time.time() + opts.budget
    plan = plan_runs(opts.plan)
    unknown = set(opts.only or []) - plan.keys()
    if unknown:  # before anything is unpacked or started
        raise SystemExit(f"--only: {sorted(unknown)} not in {opts.plan}; its runs: {list(plan)}")
    check_slimmed({plan[key]["env_id"] for key in opts.only or plan}, "campaign")  # before anything is unpacked
    opts.work.mkdir(parents=True, exist_ok=True)
    opts.state.mkdir(parents=True, exist_ok=True)
    unpack(opts.state, opts.work)
    queue = [key for key in opts.only or plan if not read_status(opts.work / key)["done"]]
    if deadline - time.time() > 2 * opts.margin:  # time to start a run: every one's flags checked before any starts
        for key in queue:
            check_script_flags([plan[key]["script"]], [*plan[key]["flags"], *extra])
    live, closed, stopping = [], [], False
    # when each run is asked to stop: PPG earlier, as it goes on to its phase's end (`--stop-at-phase-end`)
    margin = {key: opts.margin + (opts.phase_margin if stops_at_phase_end(run) else 0) for key, run in plan.items()}
    # each run's share of the cores for torch's threads: OpenMP's idle threads spin, and runs that each take all the
    # cores leave procgen's threads none (`throughput.py --suite machine`)
    share = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": str(max(1, os.cpu_count() // opts.parallel))}
    cache = opts.work / COMPILE_CACHE  # the runs' compiled stages, which travel with them
    torch_version = next((d.version for d in importlib.metadata.distributions(name="torch")), "not installed")
    window = {"machine": machine_name(), "torch": torch_version, "budget": opts.budget}  # each chunk's record: where
    while (queue and not stopping) or live:
        try:
            left = deadline - time.time()
            stopping = stopping or left < opts.margin
            # the next run that has `--margin` seconds to run before it is asked to stop starts
            fits = [key for key in queue if left > margin[key] + opts.margin]
            while fits and not stopping and len(live) < opts.parallel:
                key = fits.pop(0)
                queue.remove(key)
                # a run whose flags compile keeps its stages in the cache (`auto` on a GPU is not known here)
                compiled = throughput.compiles(plan[key]["flags"] + extra, "cpu")
                env = {**os.environ, **share, **(cache_env(cache) if compiled else {})}
                live.append(Chunk(key, plan[key], opts.work, extra, opts.checkpoint_interval, env))
            for chunk in live:
                chunk.read()
                chunk.at_once = max(chunk.at_once, len(live))
                # PPG: `--phase-margin`, or its last phase where longer (a 2-core CPU's: about 110 minutes)
                ahead = max(margin[chunk.key], opts.margin + chunk.phase_seconds())
                if stopping or left < ahead or 0 < opts.chunk_iterations <= chunk.iterations:
                    chunk.signal(signal.SIGTERM)  # finish the iteration, write a checkpoint, exit
                if left < opts.margin / 3:
                    chunk.signal(signal.SIGKILL)  # too late for its checkpoint: the next chunk goes on from the last
            for chunk in [c for c in live if c.proc.poll() is not None]:
                live.remove(chunk)
                closed.append((chunk.key, chunk.close(window)))  # (key, failed)
            time.sleep(0.1)
        except KeyboardInterrupt:
            print("campaign: stopping every run at its next checkpoint (Ctrl-C again: at once)", flush=True)
            stopping = True
    if queue and opts.budget > 0:  # said, not silent: a window too short for them (PPG's runs need --phase-margin more)
        print(f"campaign: not started, too little time left: {', '.join(queue)}", flush=True)
    paces = [read_status(opts.work / key).get("speed") for key in dict.fromkeys(key for key, _ in closed)]
    paces = [pace for pace in paces if pace]
    if paces:  # the machine's total at this many runs at once (throughput.py --suite machine measures it apart)
        print(f"campaign: this window's runs, up to {max(p['runs_at_once'] for p in paces)} at once: "
              f"{sum(p['steps_per_second'] for p in paces):,} steps/s in all, on the clock after each one's first "
              "iteration "
              f"({', '.join(str(p['steps_per_second']) for p in paces)})", flush=True)  # fmt: skip
    ran = list(dict.fromkeys(key for key, _ in closed))
    for key in ran + ([COMPILE_CACHE] if ran and cache.is_dir() else []):
        size = pack(opts.work, opts.state, key, int(opts.part_mb * 2**20))
        print(f"campaign: {key}: packed into {opts.state}, {size / 2**20:.1f} MB", flush=True)
    write_campaign_report(opts, plan)
    failed = sorted({key for key, failed in closed if failed})
    if failed:
        raise SystemExit(f"campaign: runs that failed (their log.txt says why): {', '.join(failed)}")


EACH_RUN_INTRO = """## Each run at the step it reached

Every run of the plan that has logged, at its own last step, beside the reference runs there (the report's measures:
the mean of the last 100 episodes, the share of the logged points inside the reference's range, the last tenth of the
steps; the normalised test score with the Procgen paper's easy ranges, ours and the reference runs' mean).

| run | step reached | training: ours | their range | test: ours | their range | points inside (train / test) \
| last tenth, training: ours / theirs | last tenth, test: ours / theirs | normalised test score: ours / theirs |
|---|---|---|---|---|---|---|---|---|---|"""
SIDE_BY_SIDE_INTRO = """## Side by side at equal steps

The plan's runs of one game and seed (PPG beside PPO, train-procgen's setup beside the defaults, bf16 beside fp32),
each read up to the step all of them reached, beside the reference runs there (the measures above).

| game, seed | run | to step | training: ours | their range | test: ours | their range | points inside (train / test) \
| last tenth, training: ours / theirs | last tenth, test: ours / theirs | normalised test score: ours / theirs |
|---|---|---|---|---|---|---|---|---|---|---|"""


EACH_CHUNK_INTRO = """## Each chunk as it ran

Every chunk that the campaign recorded (a chunk's record began on 2026-12-03): when (UTC), where (the machine: its GPUs
where it has any, the cores the campaign may use, the CPU's model, family and model numbers), the runs going at once,
the steps its checkpoints kept before and after, the iterations it ran, the console's seconds an iteration (median,
least to most: the first has the compiling), the steps a second on the clock after its first iteration (auxiliary
phases included), the peak resident memory and how it ended.

| run | chunk | when (UTC) | where | torch | at once | `--budget` | steps kept | iterations | s/iter: median (range) \
| steps/s | peak memory | ended |
|---|---|---|---|---|---|---|---|---|---|---|---|---|"""


def each_chunk(plan, work):
    """CAMPAIGN.md's lines for every chunk recorded in the plan's runs' status, run by run in the plan's order."""
    lines = []
    for key in plan:
        for c in read_status(work / key).get("chunks_run", []):
            pace = f"{c['steps_per_second']:,}" if c["steps_per_second"] is not None else "-"
            seconds = c["seconds_per_iteration"]
            seconds = f"{seconds[0]:.1f} ({seconds[1]:.1f} to {seconds[2]:.1f})" if seconds else "-"
            lines.append(
                f"| {key} | {c['chunk']} | {c['began']} to {c['ended']} | {c['machine']} | {c['torch']} | "
                f"{c['runs_at_once']} | {c['budget']:g} | {c['steps'][0]:,} to {c['steps'][1]:,} | {c['iterations']} | "
                f"{seconds} | {pace} | {c['peak'] or '-'} | {c['how']} |"
            )
    return ["", EACH_CHUNK_INTRO, *lines] if lines else []


def read_plan_runs(plan, work):
    """{key: its run's series (`read_runs`)} for each run of the plan that has logged a step, each read once."""
    found = {}
    for key in plan:
        if (work / key / "runs").is_dir():
            seeds = [s for seeds in read_runs([work / key]).values() for s in seeds if s["logged"]]
            if seeds:  # its newest run directory's
                found[key] = seeds[-1]
    return found


def run_cells(s, env_id, reference, upto):
    """One run's cells read up to step `upto`: ours, their range, points inside and the last tenth (ours / theirs) on
    the training and the test levels, then the normalised test score (ours / theirs); a dash where nothing is known."""
    s, cells = {**s, "logged": [step for step in s["logged"] if step <= upto]}, {}
    for split in ("train", "test"):
        if s[split] and reference.get((env_id, split)):
            r = against_reference([s], reference[env_id, split], split)
            lo, hi = np.nanmin(r["ref"]), np.nanmax(r["ref"])
            late = f"{r['late_ours']:.2f} / {r['late_ref']:.2f}"
            cells[split] = (f"{r['ours']:.2f}", f"{lo:.2f} to {hi:.2f}", f"{r['fractions'][0]:.0%}", late)
            if split == "test" and env_id in EASY_RANGES:
                ours, theirs = (normalised(env_id, v) for v in (r["ours"], np.nanmean(r["ref"])))
                cells["score"] = f"{ours:.3f} / {theirs:.3f}"
    train, test = (cells.get(split, ("-",) * 4) for split in ("train", "test"))
    return [train[0], train[1], test[0], test[1], f"{train[2]} / {test[2]}", train[3], test[3], cells.get("score", "-")]


def run_name(run):
    """A run's name in the tables: its algorithm, and its group where that is not the defaults."""
    return SCRIPTS.get(run["name"], run["name"]) + ("" if run["group"] == "defaults" else f", {run['group']}")


def each_run(plan, found, reference):
    """CAMPAIGN.md's lines for every run that has logged, each at its own last step beside the reference there."""
    lines = []
    for key, s in found.items():
        last = s["logged"][-1]
        lines.append(f"| {key} | {last:,} | " + " | ".join(run_cells(s, plan[key]["env_id"], reference, last)) + " |")
    return ["", EACH_RUN_INTRO, *lines] if lines else []


def side_by_side(plan, found, reference):
    """CAMPAIGN.md's lines for the runs of one game and seed that differ in script or setup, each cut at the last step
    all of them logged (the report sets each beside the reference at its own step, so unequal steps)."""
    by_game_seed = {}
    for key, run in plan.items():
        if key in found:
            by_game_seed.setdefault((run["env_id"], run["seed"]), []).append(key)
    lines = []
    for (env_id, seed), keys in by_game_seed.items():
        if len(keys) < 2:
            continue
        common = min(found[key]["logged"][-1] for key in keys)
        for key in keys:
            cells = run_cells(found[key], env_id, reference, common)
            lines.append(f"| {env_id}, {seed} | {run_name(plan[key])} | {common:,} | " + " | ".join(cells) + " |")
    return ["", SIDE_BY_SIDE_INTRO, *lines] if lines else []


def phases_beside_ppo(opts, plan):
    """Each PPG run of the plan phase by phase (`phases`), beside the PPO run of its game, seed and group where the
    plan has one: `phases/KEY.md` in the report's folder."""
    same = lambda run: (run["env_id"], run["seed"], run["group"])  # noqa: E731
    for key, run in plan.items():
        ppg = sorted((opts.work / key).glob("runs/*/"))
        if not run["script"].startswith("ppg") or not ppg:
            continue
        partners = [k for k, r in plan.items() if r["script"].startswith("ppo") and same(r) == same(run)]
        ppo = [d for k in partners for d in sorted((opts.work / k).glob("runs/*/"))]
        (opts.report / "phases").mkdir(exist_ok=True)
        title = f"{opts.title}; {key}" + (f" beside {ppo[-1].parent.parent.name}" if ppo else "")
        out, ppo = opts.report / "phases" / f"{key}.md", ppo[-1] if ppo else None
        phases(argparse.Namespace(ppg=ppg[-1], ppo=ppo, title=title, reference=opts.reference, window=4, out=out))


def write_campaign_report(opts, plan):
    """CAMPAIGN.md: where each run of the plan stands; and each group's report at the steps its runs reached."""
    opts.report.mkdir(parents=True, exist_ok=True)
    header = (
        "| run | script | flags | step reached | of | done | chunks | steps/s (its last timed chunk) "
        "| peak resident memory (its last chunk measured) | notes |"
    )
    lines = [f"# The campaign: {opts.title}", "", header, "|---" * 10 + "|"]
    for key, run in plan.items():
        s = read_status(opts.work / key)
        pace, memory = s.get("speed"), s.get("memory")
        pace = f"{pace['steps_per_second']:,}, {pace['runs_at_once']} run(s) at once" if pace else ""
        memory = f"{memory['peak']} of {memory['of']} (chunk {memory['chunk']})" if memory else ""
        # a run killed after its last checkpoint logged steps that the next chunk runs again: what is kept, said
        kept = kept_steps(s)
        reached = f"{s['step']:,}" + (f" (kept: {kept:,})" if kept < s["step"] else "")
        lines.append(
            f"| {key} | {run['script']} | {' '.join(run['flags']) or '(defaults)'} | {reached} | "
            f"{run['total_timesteps']:,} | {'yes' if s['done'] else 'no'} | {s['chunks']} | {pace} | {memory} | "
            f"{'; '.join(s['notes'])} |"
        )
    try:  # as the reports below: the state is packed already, and a table that fails loses nothing
        found, reference = read_plan_runs(plan, opts.work), read_reference(opts.reference)
        lines += each_run(plan, found, reference) + side_by_side(plan, found, reference)
    except (Exception, SystemExit) as exc:
        print(f"campaign: the runs at their steps and side by side were not written ({exc})", flush=True)
    lines += each_chunk(plan, opts.work)
    (opts.report / "CAMPAIGN.md").write_text("\n".join(lines) + "\n")
    try:
        phases_beside_ppo(opts, plan)
    except (Exception, SystemExit) as exc:
        print(f"campaign: the PPG runs' phases were not written ({exc})", flush=True)
    for group in dict.fromkeys(run["group"] for run in plan.values()):
        runs = [opts.work / key for key, run in plan.items() if run["group"] == group and (opts.work / key).exists()]
        if not runs:
            continue
        out = opts.report / group
        title = f"{opts.title}; {group}"
        try:  # the chunk's state is packed already: a report that fails (no rliable on this machine) loses nothing
            report(argparse.Namespace(runs=runs, out=out, title=title, reference=opts.reference))
        except (Exception, SystemExit) as exc:
            print(
                f"campaign: the report of {group} was not written ({exc}); `learning.py campaign --budget 0` "
                "on another machine writes it from the packed state",
                flush=True,
            )


def parse(argv):
    """The command line as (opts, the flags after `--`, which go to the scripts)."""
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="train every script x game x seed")
    p_run.add_argument("--scripts", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    p_run.add_argument("--env-ids", nargs="+", default=["starpilot"], help="Procgen games, or all: the 16")
    p_run.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    p_run.add_argument("--total-timesteps", type=int, default=25_000_000)
    p_run.add_argument("--parallel", type=int, default=1, help="runs at a time")
    p_run.add_argument("--random-episodes", type=int, default=500, help="episodes of the random-policy baseline")
    p_report = sub.add_parser("report", help="plot and tabulate the runs")
    p_report.add_argument("--out", type=Path, default=HERE, help="where learning.png, LEARNING.md and curves.csv go")
    p_report.add_argument("--title", default="returns against steps", help="what the runs were (machine, steps)")
    p_report.add_argument("--reference", type=Path, default=REFERENCE, help="the reference runs' curves (csv.gz)")
    p_run.add_argument("--runs", type=Path, default=HERE / "learning_runs", help="the folder holding runs/")
    p_report.add_argument(
        "--runs", type=Path, nargs="+", default=[HERE / "learning_runs"], help="folders holding runs/"
    )
    p_compare = sub.add_parser("compare", help="two runs' statistics side by side (one option changed)")
    p_compare.add_argument("run_dirs", nargs=2, type=Path, help="the two runs' TensorBoard directories")
    p_compare.add_argument("--labels", nargs=2, default=["A", "B"], help="what each run was")
    p_compare.add_argument("--title", default="same seed", help="what the runs were (machine, steps, flags)")
    p_compare.add_argument("--out", type=Path, default=HERE / "COMPARE.md", help="the markdown file written")
    p_phases = sub.add_parser("phases", help="a PPG run phase by phase, beside a PPO run and the reference")
    p_phases.add_argument("ppg", type=Path, help="the PPG run's TensorBoard directory")
    p_phases.add_argument("--ppo", type=Path, default=None, help="a PPO run of the same game and seed, to set beside")
    p_phases.add_argument("--title", default="same seed", help="what the runs were (machine, steps, flags)")
    p_phases.add_argument("--reference", type=Path, default=REFERENCE, help="the reference runs' curves (csv.gz)")
    p_phases.add_argument("--window", type=int, default=1, help="iterations before and after each auxiliary phase")
    p_phases.add_argument("--out", type=Path, default=HERE / "PHASES.md", help="the markdown file written")
    p_campaign = sub.add_parser("campaign", help="advance the plan's long runs by one window of time, chunk by chunk")
    p_campaign.add_argument("--budget", type=float, required=True, help="seconds: the runs stop and are packed by then")
    p_campaign.add_argument("--plan", type=Path, default=PLAN, help="the runs, in order (JSON: see campaign/README.md)")
    p_campaign.add_argument(
        "--state",
        type=Path,
        default=HERE / "campaign" / "state",
        help="the packed runs that travel between windows: read first, rewritten at the end",
    )
    p_campaign.add_argument("--work", type=Path, default=WORK, help="the runs, unpacked")
    p_campaign.add_argument(
        "--report",
        type=Path,
        default=HERE / "campaign",
        help="where CAMPAIGN.md and each group's report (LEARNING.md, learning.png, curves.csv) go",
    )
    p_campaign.add_argument("--parallel", type=int, default=4, help="runs at a time")
    p_campaign.add_argument(
        "--only",
        nargs="+",
        help="these runs alone (their keys, game__name__seed), in this order: those whose state came",
    )
    p_campaign.add_argument(
        "--margin",
        type=float,
        default=90,
        help="seconds before the budget's end at which each run is asked to stop at a checkpoint",
    )
    p_campaign.add_argument(
        "--phase-margin",
        type=float,
        default=150,
        help="seconds added to --margin for a PPG run, which stops at its phase's end (its auxiliary epochs included); "
        "its last whole phase's seconds where longer",
    )
    p_campaign.add_argument(
        "--checkpoint-interval",
        type=int,
        default=32,
        help="a new run's periodic checkpoints (iterations): what a killed run goes on from (32: PPG's every phase)",
    )
    p_campaign.add_argument(
        "--chunk-iterations",
        type=int,
        default=0,
        help="also stop each run after this many iterations in this window (0: the budget alone)",
    )
    p_campaign.add_argument("--part-mb", type=float, default=15, help="the largest packed file, in MB")
    p_campaign.add_argument(
        "--title", default="the protocol's runs at the steps they reached", help="what the runs were (machine, commit)"
    )
    p_campaign.add_argument("--reference", type=Path, default=REFERENCE, help="the reference runs' curves (csv.gz)")
    return parser.parse_args(argv), extra


def check_script_flags(scripts, extra):
    """Stop before any run starts where the flags after `--` are not a script's: its own one-line parse error."""
    sys.path.insert(0, str(ROOT))
    for script in scripts:
        module = importlib.import_module(script)  # the full files' parse_args, or tyro.cli as the lean files call it
        module.plumbing.parse_args(module.Args, extra) if hasattr(module, "plumbing") else tyro.cli(
            module.Args, args=extra
        )


def main():
    opts, extra = parse(sys.argv[1:])
    commands = {"run": run, "report": report, "compare": compare, "phases": phases, "campaign": campaign}
    commands[opts.command](*((opts, extra) if opts.command in ("run", "campaign") else (opts,)))


if __name__ == "__main__":
    main()
