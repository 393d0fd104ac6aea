"""The benchmarks run and write well-formed results (their timings are never asserted)."""

import argparse
import csv
import gzip
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, load_script, outcome, read_scalars, routed, routing, smoke_args

sys.path.insert(0, str(ROOT / "benchmarks"))


def test_every_row_of_the_speed_tables_is_a_command_its_script_takes(monkeypatch):
    """Each row's flags pass its script's parsing and checks (at the default sizes, whatever memory this machine has),
    so that a row the quick check below leaves out still starts."""
    throughput = __import__("throughput")
    tables = [throughput.CONFIGS, throughput.OPTION_CONFIGS, throughput.GPU_CONFIGS, throughput.HOST_CONFIGS]
    for name, file, flags, _ in [row for table in tables for row in table]:
        script = load_script(file)
        if hasattr(script, "host_memory"):  # the full files' memory check
            monkeypatch.setattr(script.plumbing, "host_memory", lambda: float(2**40))
        status, lines = outcome(script, [*flags, "--device", "cpu"])
        assert status == 0 and not lines, (name, lines)


def test_throughput_quick_writes_a_table_and_a_chart(tmp_path):
    """Two rows of the speed table (the default, PPG's) at tiny sizes: the table, the chart. (A rollout option's row:
    the GPU kit's quick check below.)"""
    only = ["PPO fp32 (default)", "PPG dual (default)"]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--quick", "--out", str(tmp_path), "--only",
           *only]  # fmt: skip
    proc = run_routed(cmd, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "RESULTS.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| configuration")]
    assert [row.split("|")[1].strip() for row in rows] == only
    for row in rows:  # steps/s, ratio, env, inference, eval, update: positive numbers
        cells = [c.strip() for c in row.split("|")[2:-1]]
        assert float(cells[0]) > 0 and re.fullmatch(r"\d+\.\d\dx", cells[1])
        assert all(float(c) >= 0 for c in cells[2:6]) and float(cells[-1]) > 0
        # the test loop ran, unless the test envs are stepped inside the rollout (no second loop to time)
        assert (float(cells[4]) > 0) == ("--rollout" not in row), row
    assert "PPG" not in rows[0] and any(row.split("|")[8].strip() for row in rows if "PPG" in row)  # aux epoch timed
    assert re.search(r"Ceiling, procgen alone .*\d steps/s with 1 thread", text)
    assert (tmp_path / "throughput.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("phase", [1, 2])
def test_a_ppg_row_with_phases_of_one_iteration_counts_each_phase_in_its_iteration(phase, tmp_path):
    """The GPU table's PPG rows close a phase every iteration: their steps/s are over the iteration and its auxiliary
    phase, which the script logs apart (the H100's table of 2026-11-28 left it out: 14,601 steps/s for PPG's
    defaults, about 4,900 with it). With phases of two iterations, the iteration's own seconds alone."""
    throughput = __import__("throughput")
    flags = [*throughput.QUICK_SIZES, *throughput.QUICK_NETWORK, *throughput.QUICK_PPG, "--n-iteration", str(phase)]
    batch = 4 * 32
    r = throughput.run("ppg_procgen_full", flags, 2 * phase, batch, tmp_path, timed=phase)
    aux = r.get("aux_per_iteration", 0)
    assert (aux > 0) == (phase == 1) and r["perf/aux_seconds"] > 0
    assert r["sps"] == pytest.approx(batch / (r["perf/iteration_seconds"] + aux))


# Planted in the kit's quick run, run first by every Python process of the run (`routed`'s at_start): the speed
# table's default row fails at its start, its folded row too (with HANG set, it hangs), the host side's lean row
# fails. Nothing in the kit or the benchmark knows of them.
PLANTED = """
import os, sys, time
argv = sys.argv
def fail(why):
    print(f"planted failure: {why}", file=sys.stderr, flush=True)
    os._exit(1)
if argv[0].endswith("ppo_procgen_full.py") and "bench" in argv and "--rollout" not in argv:
    fail("the default row")
if argv[0].endswith("ppo_procgen_full.py") and "bench" in argv and "folded" in argv:
    time.sleep(600) if "HANG" in os.environ else fail("the folded row")
if argv[0].endswith("throughput.py") and argv[1:3] == ["--tiny-network", "ppo_procgen"]:
    fail("the lean host row")
"""


def planted(tmp_path, code):
    """A file of `code`, for every Python process of a routed run to run first (`run_routed`'s at_start)."""
    (tmp_path / "planted.py").write_text(code)
    return tmp_path / "planted.py"


def run_routed(cmd, timeout, at_start=None, **env):
    """`cmd` (`python FILE ARGS`) run as conftest's `routed` runs it, with `env` added to its environment."""
    cmd, base = routed(cmd, at_start)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**base, **env})


def test_the_gpu_kit_runs_every_step_in_quick_mode_whatever_its_rows_do(tmp_path):
    """The GPU kit on a CPU (`--quick`): its three steps run and GPU.md gathers them. Of the speed table's three rows
    two are made to fail: the table is written with the third measured, and names the others with the exit status and
    last stderr line. (A row past its time limit: the test below.)"""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--quick", "--out", str(tmp_path / "kit")]
    proc = run_routed(cmd, timeout=900, at_start=planted(tmp_path, PLANTED))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # the speed step is missing rows
    kit = (tmp_path / "kit" / "GPU.md").read_text()
    for title, verdict in (("CUDA tests", "ok"), ("Speed options", "FAILED (exit 1)"), ("Machine full", "ok")):
        assert f"## {title}" in kit and f"{title}: {verdict}" in proc.stdout, (title, proc.stdout)
    assert kit.count("\n## ") == 3, kit
    # the machine full, 1 and 2 runs at once in a check: the sum of the runs' steps per second, each run's
    together = [
        row.split("|")[1:-1] for row in kit.split("## Machine full")[1].splitlines() if row[:4] in ("| 1 ", "| 2 ")
    ]
    assert [int(row[0]) for row in together] == [1, 2] and all(float(row[1]) >= float(row[2]) > 0 for row in together)
    assert "<testcase" in (tmp_path / "kit" / "cuda_tests.xml").read_text()  # each CUDA test's outcome, by name
    speed = {
        row.split("|")[1].strip(): row
        for row in kit.split("## Machine full")[0].splitlines()
        if row.startswith("| PPO")
    }
    assert list(speed) == [
        "PPO eager, --rollout plain (the lean loop)",
        "PPO default (a GPU: CUDA graphs, --rollout folded)",
        "PPO eager, --rollout folded",
    ], speed
    cells = [c.strip() for c in speed["PPO eager, --rollout plain (the lean loop)"].split("|")[2:-1]]  # steps/s, ...
    assert float(cells[0]) > 0 and float(cells[4]) > 0  # the test envs' own loop, timed
    for row, planted_as in (
        ("PPO default (a GPU: CUDA graphs, --rollout folded)", "the default row"),
        ("PPO eager, --rollout folded", "the folded row"),
    ):
        assert f"failed, exit status 1: planted failure: {planted_as}" in speed[row], speed[row]


def test_the_host_suite_runs_each_script_s_loop_beside_procgen_alone(tmp_path):
    """`throughput.py --suite host`, quick: each row's training steps/s, procgen alone's, their ratio and the parts;
    a row made to fail (the lean one) is named with its exit status and last stderr line, and the run exits 1."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--suite", "host", "--quick", "--out",
           str(tmp_path / "out"), "--only", "PPO lean", "PPO full, --rollout plain"]  # fmt: skip
    proc = run_routed(cmd, timeout=300, at_start=planted(tmp_path, PLANTED))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [
        line.split("|")[1:-1] for line in (tmp_path / "out" / "HOST.md").read_text().splitlines() if line[:2] == "| "
    ]
    assert [row[0].strip() for row in rows[1:]] == ["PPO full, --rollout plain", "PPO lean (ppo_procgen.py)"]
    full, lean = rows[1:]
    assert float(full[1]) > 0 and float(full[2]) > 0 and 0 < float(full[3]) < 2, full
    assert all(float(c) >= 0 for c in full[4:8]), full
    assert "failed, exit status 1: planted failure: the lean host row" in lean[1], lean


def test_a_speed_row_past_its_time_limit_is_stopped_and_named(tmp_path):
    """A row that hangs (planted: the folded row) is killed at `--timeout` with the processes it started, and the table
    names it with the time limit; the run exits 1."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--suite", "gpu", "--quick", "--out",
           str(tmp_path / "out"), "--timeout", "3", "--only", "PPO eager, --rollout folded"]  # fmt: skip
    proc = run_routed(cmd, timeout=120, at_start=planted(tmp_path, PLANTED), HANG="1")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [row for row in (tmp_path / "out" / "GPU_SPEED.md").read_text().splitlines() if row.startswith("| PPO")]
    assert len(rows) == 1 and "timed out after 3 s" in rows[0], rows


def test_the_gpu_kit_stops_a_step_past_its_time_limit_and_says_so(tmp_path):
    """A step that outlasts its limit (half a second: each step's process is made to wait a minute first; the tests'
    own start once took longer, until a fast CPU ran them in less) is stopped with the processes it started; the
    console and GPU.md say it timed out, and the kit goes on to the next step and exits 1."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--quick", "--out", str(tmp_path), "--timeout", "0.5",
           "--skip", "Speed options"]  # fmt: skip
    (tmp_path / "GPU_SPEED.md").write_text("# an earlier run's\n\n| PPO stale row |\n")  # not this run's: cleared
    slow = "import sys, time\nif '-k' in sys.argv or '--suite' in sys.argv:\n    time.sleep(60)\n"  # the steps' own
    proc = run_routed(cmd, timeout=120, at_start=planted(tmp_path, slow))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    kit = (tmp_path / "GPU.md").read_text()
    assert "stale" not in kit and not (tmp_path / "GPU_SPEED.md").exists()
    for title in ("CUDA tests", "Machine full"):
        assert f"{title}: TIMED OUT after 0.5 s in " in proc.stdout, proc.stdout
        section = kit.split(f"## {title}")[1].split("##")[0]
        assert "timed out after 0.5 s, " in section, section


def test_the_gpu_kit_stops_at_once_where_procgen_does_not_load(tmp_path):
    """A machine whose procgen cannot load its library (one GPU machine lacked libGL.so.1) stops the kit before its
    first step, in one line that says why; GPU.md says it too."""
    cant_load = "import sys\nif sys.argv[0] == '-c':\n    sys.exit(\"OSError: cannot load library 'libenv.so'\")\n"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--quick", "--out", str(tmp_path / "kit")]
    proc = run_routed(cmd, timeout=120, at_start=planted(tmp_path, cant_load))
    assert proc.returncode == 1 and "procgen does not load" in proc.stderr and "libenv.so" in proc.stderr, proc.stderr
    assert "CUDA tests" not in proc.stdout and "libenv.so" in (tmp_path / "kit" / "GPU.md").read_text()


def test_the_gpu_kit_names_the_tests_that_failed():
    """pytest's verbose lines, with workers and without, and its summary: each failed test once, by name."""
    gpu = __import__("gpu")
    output = (
        "[gw3] [ 45%] FAILED tests/test_gpu.py::test_a[cuda-x] \n[gw1] [ 50%] PASSED tests/test_gpu.py::test_b\n"
        "tests/test_smoke.py::test_smoke[cuda-ppo] FAILED [ 60%]\nFAILED tests/test_gpu.py::test_a[cuda-x] - Err\n"
        "ERROR tests/test_z.py::test_c - boom\n"
    )
    assert gpu.failed_tests(output) == [
        "FAILED tests/test_gpu.py::test_a[cuda-x]",
        "FAILED tests/test_smoke.py::test_smoke[cuda-ppo]",
        "ERROR tests/test_z.py::test_c",
    ]


def test_quick_mode_never_writes_over_the_committed_results():
    throughput = __import__("throughput")
    committed = ROOT / "benchmarks"
    assert throughput.default_out(quick=False) == committed
    quick = throughput.default_out(quick=True)
    assert quick != committed and (quick / "RESULTS.md") != (committed / "RESULTS.md")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(quick / "RESULTS.md")], cwd=ROOT)
    assert ignored.returncode == 0  # git ignores what a quick check writes


def compare_rows(run_a, run_b, out):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "compare", str(run_a), str(run_b),
           "--labels", "a", "b", "--out", str(out)]  # fmt: skip
    proc = run_routed(cmd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        [c.strip() for c in line.split("|")[1:-1]] for line in out.read_text().splitlines() if line.startswith("| ")
    ]
    return [r for r in rows if r[0].startswith(("losses/", "perf/"))], [
        r for r in rows if re.fullmatch(r"[\d,]+", r[0])
    ]


def write_reference(path, runs):
    """A reference file in the committed one's format: {(game, split): [per run: [(step, eprewmean)]]}."""
    with gzip.open(path, "wt", newline="") as f:
        out = csv.writer(f)
        out.writerow(["game", "run", "split", "step", "eprewmean", "eplenmean"])
        for (game, split), per_run in runs.items():
            for run, points in enumerate(per_run):
                out.writerows([game, run, split, step, value, 100] for step, value in points)


def test_against_reference_reads_the_reference_at_our_steps(tmp_path):
    learning = __import__("learning")
    steps = list(range(100, 1001, 100))
    # one episode ends at each logged step, returning k at step 100 k: our curve there is the mean of 1..k, (k + 1) / 2
    seed = {"logged": steps, "train": [(step, float(k)) for k, step in enumerate(steps, 1)], "test": []}
    flat = lambda value: [(0, value), (2000, value)]  # noqa: E731
    write_reference(tmp_path / "ref.csv.gz", {("starpilot", "train"): [flat(0.0), flat(2.0), [(0, 1.0), (2000, 5.0)]]})
    reference = learning.read_reference(tmp_path / "ref.csv.gz")[("starpilot", "train")]
    result = learning.against_reference([seed], reference, "train")
    # the third run reads 1 + 0.2 k at step 100 k: the range's top is max(2, 1 + 0.2 k); ours is inside for k <= 3
    assert (
        result["fractions"] == [0.3] and result["above"] == [0.7] and result["last"] == 1000 and result["ours"] == 5.5
    )
    np.testing.assert_allclose(result["ref"], [0.0, 2.0, 3.0])
    assert result["late_ours"] == 5.5 and result["late_ref"] == pytest.approx(5 / 3)  # the last tenth: step 1000 alone


def write_run(run_dir, series):
    """A run's TensorBoard events: {tag: [(step, value)]}."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir))
    for tag, points in series.items():
        for step, value in points:
            writer.add_scalar(tag, value, step)
    writer.close()


def test_phases_sets_each_auxiliary_phase_between_the_iterations_around_it(tmp_path):
    """A PPG run of 6 iterations of 100 steps, phases ending at 300 and 600, beside a PPO run logged to 400; windows
    of 2 iterations around each auxiliary phase."""
    aux = {f"losses/aux/{key}": [(300, v), (600, v / 2)] for key, v in (("kl_loss", 0.02), ("aux_value_loss", 0.5),
                                                                          ("real_value_loss", 0.4))}  # fmt: skip
    ppg, ppo = tmp_path / "starpilot__ppg_procgen__2__1", tmp_path / "starpilot__ppo_procgen__2__1"
    write_run(ppg, {"charts/SPS": [(s, 1) for s in range(100, 601, 100)], **aux,
                    "losses/approx_kl": [(s, s / 1000) for s in range(100, 601, 100)],
                    "charts/episodic_return": [(150, 7.0), (250, 1.0), (300, 3.0), (350, 5.0), (550, 2.0), (600, 4.0)],
                    "charts/test_episodic_return": [(300, 1.0)]})  # fmt: skip
    write_run(ppo, {"charts/SPS": [(s, 1) for s in range(100, 401, 100)],
                    "losses/approx_kl": [(s, s / 100) for s in range(100, 401, 100)],
                    "charts/episodic_return": [(100, 2.0), (300, 6.0)]})  # fmt: skip
    flat = lambda value: [(0, value), (2000, value)]  # noqa: E731
    write_reference(tmp_path / "ref.csv.gz", {("starpilot", "train"): [flat(0.0), flat(2.0), flat(1.0)]})
    cmd = [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "phases", str(ppg), "--ppo", str(ppo), "--window",
           "2", "--reference", str(tmp_path / "ref.csv.gz"), "--out", str(tmp_path / "PHASES.md")]  # fmt: skip
    proc = run_routed(cmd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in (tmp_path / "PHASES.md").read_text().splitlines()]
    rows = [r for r in rows if r and r[0].isdigit()]
    first, second = ["1", "300", "0.0200", "0.5000", "0.4000"], ["2", "600", "0.0100", "0.2500", "0.2000"]
    ends = {"1": ["3.67", "4.00"], "2": ["3.67", "-"]}  # the last 100 episodes' means at the phase's end: PPG, PPO
    assert rows == [
        [*first, "0.2500 / 0.4500", "2.5000 / -", "train", "3.67 (3) / 6.00 (1)", "5.00 (1) / not run", *ends["1"],
         "0.00 to 2.00"],
        [*first, "0.2500 / 0.4500", "2.5000 / -", "test", "1.00 (1) / -", "- / -", "1.00", "-", "-"],
        [*second, "0.5500 / -", "- / -", "train", "3.00 (2) / not run", "not run / not run", *ends["2"],
         "0.00 to 2.00"],
        [*second, "0.5500 / -", "- / -", "test", "- / -", "not run / -", "1.00", "-", "-"],
    ]  # fmt: skip


def test_iqm_over_games_is_the_interquartile_mean_with_an_interval_around_it():
    learning = __import__("learning")
    scores = np.random.default_rng(0).normal(size=(3, 4))  # 3 runs x 4 games
    iqm, (low, high) = learning.iqm_with_ci(scores)
    middle = np.sort(scores.ravel())[3:9]  # the middle half of the 12 scores
    assert iqm == pytest.approx(middle.mean()) and low < iqm < high
    assert learning.iqm_with_ci(scores) == (iqm, (low, high))  # a fixed seed: the same interval on every report


FIVE_GAMES = ["bigfish", "climber", "coinrun", "dodgeball", "fruitbot"]


def five_game_report(tmp_path, monkeypatch, title="five games"):
    """The report over five games, one run of ours each, the reference's three runs apart; returns its figures."""
    import matplotlib.figure

    learning = __import__("learning")
    run = {"logged": [100, 200], "train": [(50, 1.0), (150, 2.0)], "test": [(60, 0.5)], "seed": 1}
    monkeypatch.setattr(learning, "read_runs", lambda runs_dirs: {(g, "ppo_procgen"): [run] for g in FIVE_GAMES})
    apart = [[(0, 0.0), (300, 3.0 + i)] for i in range(3)]
    write_reference(tmp_path / "ref.csv.gz", {(g, k): apart for g in FIVE_GAMES for k in ("train", "test")})
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    opts = __import__("argparse").Namespace(runs=[tmp_path], out=tmp_path / "out", title=title,
                                            reference=tmp_path / "ref.csv.gz")  # fmt: skip
    learning.report(opts)
    return figures


def test_the_aggregate_gives_no_interval_over_one_run_a_game(tmp_path, monkeypatch):
    """Ours, one run a game: the IQM without an interval (the bootstrap resamples runs within a game, so with one it
    would give the point itself as its interval); the reference's three runs a game: the IQM with its interval."""
    five_game_report(tmp_path, monkeypatch)
    ours, theirs = [line for line in (tmp_path / "out" / "LEARNING.md").read_text().splitlines() if "IQM" in line]
    assert ours.startswith("- PPO: ") and ours.endswith("(one run a game: no interval)")
    low, high = map(float, re.search(r"95% CI (\S+) to (\S+), rliable\)$", theirs).groups())
    assert theirs.startswith("- OpenAI's PPO beside PPO: ") and low < high


def test_the_report_sets_cleanrl_s_published_returns_beside_ours(tmp_path, monkeypatch):
    """Of the five games, bigfish alone has CleanRL's published PPO returns: one row, ours at the last step on both
    splits (the mean of the episodes so far: 1.5 and 0.5) beside CleanRL's 25M-step figure."""
    five_game_report(tmp_path, monkeypatch)
    text = (tmp_path / "out" / "LEARNING.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and " +- " in line]
    assert rows == ["| bigfish | PPO | 200 | 1.50 | 0.50 | 16.46 +- 2.71 |"]
    assert "train on all levels (`num_levels=0`)" in text


def test_the_learning_chart_gives_every_game_its_own_two_charts(tmp_path, monkeypatch):
    """Five games (two lines of four places): each game's training and test charts stand one over the other in a
    place of their own, the three places left over hidden."""
    figures = five_game_report(tmp_path, monkeypatch)
    grid = figures[0].axes[0].get_gridspec()
    places = {}
    for ax in figures[0].axes:
        spec = ax.get_subplotspec()
        places[spec.rowspan.start, spec.colspan.start] = ax.get_title() if ax.get_visible() else None
    assert (grid.nrows, grid.ncols) == (4, 4)
    for place, game in enumerate(FIVE_GAMES):
        line, col = 2 * (place // 4), place % 4
        assert places[line, col] == f"{game}, training levels" and places[line + 1, col] == f"{game}, test levels (all)"
    assert [places[line, col] for line in (2, 3) for col in (1, 2, 3)] == [None] * 6


def test_the_learning_chart_s_title_stands_above_the_charts(tmp_path, monkeypatch):
    """A title of several lines (a report's names its machines and commits) stays clear of the top charts' titles."""
    fig = five_game_report(tmp_path, monkeypatch, title="a long title " * 80)[0]
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)  # the figure title, drawn
    assert title.height > 20  # three lines, wrapped
    assert title.y0 >= max(ax.get_tightbbox(renderer).y1 for ax in fig.axes if ax.get_visible())


def test_learning_report_from_smoke_runs(tmp_path):
    runs, learning = tmp_path / "runs_dir", ROOT / "benchmarks" / "learning.py"
    for name in ("ppo_procgen", "ppg_procgen"):  # real small runs, each with its own smoke flags but 8 test envs,
        flags = smoke_args(name)  # so that a test episode ends in each run's 64 test steps
        flags[flags.index("--num-eval-envs") + 1] = "8"
        cmd = [sys.executable, str(learning), "run", "--scripts", name, "--env-ids", "starpilot", "--seeds", "1",
               "--total-timesteps", "256", "--random-episodes", "20", "--runs", str(runs), "--", *flags]  # fmt: skip
        proc = run_routed(cmd, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # reference runs that bracket any return: every point of ours lies inside their range
    wide = [[(0, -1000.0), (512, -1000.0)], [(0, 1000.0), (512, 1000.0)], [(0, 0.0), (512, 0.0)]]
    write_reference(tmp_path / "ref.csv.gz", {("starpilot", split): wide for split in ("train", "test")})
    report = [sys.executable, str(learning), "report", "--runs", str(runs), "--out", str(tmp_path / "out"), "--title",
              "smoke", "--reference", str(tmp_path / "ref.csv.gz")]  # fmt: skip
    proc = run_routed(report, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "out" / "LEARNING.md").read_text()
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| starpilot")]
    rows, published = cells[:4], cells[4:]  # the table beside the reference runs, then CleanRL's beside ours
    assert [r[:5] for r in rows] == [
        ["starpilot", algorithm, split, "1", "256"] for split in ("train", "test") for algorithm in ("PPO", "PPG")
    ]
    for r in rows:
        assert r[6] == "-1000.00, 1000.00, 0.00 (-1000.00 to 1000.00)" and r[7] == "yes" and r[8] == "100% (0% above)"
        assert r[10] == "0.00"
    assert re.search(r"- PPO: starpilot -?\d\.\d{3}", text) and "Random policy on the training levels" in text
    lo, hi = __import__("learning").EASY_RANGES["starpilot"]  # the reference runs at our last step: -1000, 1000, 0
    assert f"- OpenAI's PPO beside PPO: starpilot {(0 - lo) / (hi - lo):.3f}" in text  # their mean, normalised
    assert (tmp_path / "out" / "learning.png").read_bytes()[:4] == b"\x89PNG"
    with open(tmp_path / "out" / "curves.csv") as f:  # the curves charted: at the last step, the table's values
        curves = {(r["algorithm"], r["seed"], r["step"]): r for r in csv.DictReader(f)}
    assert sorted(curves) == [(a, "1", step) for a in ("PPG", "PPO") for step in ("128", "256")]
    for r in rows:
        assert f"{float(curves[r[1], '1', '256'][r[2]]):.2f}" == r[5]
    # CleanRL's 25M-step returns beside ours at our last step, both splits: the values of the table above
    ours = {(r[1], r[2]): r[5] for r in rows}
    cleanrl = {"PPO": "30.99 +- 1.96", "PPG": "34.82 +- 13.77"}
    assert published == [["starpilot", a, "256", ours[a, "train"], ours[a, "test"], cleanrl[a]] for a in cleanrl]

    # compare: a run against itself differs nowhere; PPO against PPG differs
    ppg_run, ppo_run = sorted((runs / "runs").iterdir())
    stats, per_iteration = compare_rows(ppo_run, ppo_run, tmp_path / "same.md")
    assert [r[0] for r in stats] == list(__import__("learning").COMPARED)
    assert all(r[1] == r[2] and float(r[3]) == 0 and float(r[4]) == 0 for r in stats)
    assert [r[0] for r in per_iteration] == ["128", "256"] and all(r[1] == r[2] and r[3] == r[4] for r in per_iteration)
    stats, per_iteration = compare_rows(ppo_run, ppg_run, tmp_path / "algorithms.md")
    assert len(stats) == 6 and all(float(r[4]) > 0 for r in stats if r[0] != "losses/clipfrac")
    assert len(per_iteration) == 2 and per_iteration[0][1] != per_iteration[0][2]  # approx_kl


def test_a_speed_table_run_past_its_time_limit_is_killed_and_said(tmp_path):
    """`--timeout`: a run that outlasts it is killed (not waited for) and TimeoutError names it."""
    import throughput

    start = time.time()
    with pytest.raises(TimeoutError, match="killed after 0.5 s"):
        throughput.run_logged([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, timeout=0.5)
    assert time.time() - start < 10


def test_a_speed_row_that_fails_or_times_out_is_written_and_the_rows_after_it_run(tmp_path, monkeypatch):
    """The speed table goes on past a row whose run fails or times out, and writes each as it is known: a failed row
    with its exit status and the last lines of its stderr, a row past its time limit as such, the rows after both,
    each named as not run until it has run (a benchmark stopped there leaves it so)."""
    import throughput

    failing = [sys.executable, "-c", "import sys; print('no such kernel', file=sys.stderr); sys.exit(3)"]
    hanging = [sys.executable, "-c", "import time; time.sleep(30)"]
    measured = {"sps": 100.0, "peak_rss_gib": 1.0, **{f"perf/{k}_seconds": 0.1 for k in ("env", "inference", "eval")}}
    measured |= {"perf/update_seconds": 0.2, "row_seconds": 3.0, "cudagraph_skips": 0, "skip_reason": ""}
    tables = []

    def run(script, flags, iterations, batch, workdir, device="cpu", env=None, timeout=None, timed=1):
        # the last row (PPG's): the table as a time limit stopping the benchmark here would leave it
        if "--n-iteration" in flags:
            tables.append((workdir / "RESULTS.md").read_text())
        if env or "folded" in flags:  # the OMP_WAIT_POLICY row fails, the folded row hangs: real processes, as rows run
            throughput.run_logged(failing if env else hanging, workdir, env, timeout=0.5)
        return dict(measured)

    monkeypatch.setattr(throughput, "run", run)
    monkeypatch.setattr(throughput, "ceiling", lambda *a: 1000.0)
    only = ["PPO fp32 (default)", "OMP_WAIT_POLICY", "--rollout folded", "PPG dual"]
    argv = ["throughput.py", "--quick", "--out", str(tmp_path), "--timeout", "0.5", "--only", *only]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="2 row"):  # the table written, the exit status says rows are missing
        throughput.main()
    rows = {line.split("|")[1].strip(): line for line in (tmp_path / "RESULTS.md").read_text().splitlines()[1:]
            if line.startswith("| PP")}  # fmt: skip
    assert sorted(rows) == sorted(["PPO fp32 (default)", "PPO fp32, OMP_WAIT_POLICY=PASSIVE",
                                   "PPO fp32, --rollout folded", "PPG dual (default)"])  # fmt: skip
    assert "failed, exit status 3: no such kernel" in rows["PPO fp32, OMP_WAIT_POLICY=PASSIVE"]
    assert "timed out after 0.5 s" in rows["PPO fp32, --rollout folded"]
    assert "| 100 |" in rows["PPG dual (default)"]  # the row after both was measured
    assert f"| PPG dual (default) | {throughput.NOT_RUN} |" in tables[0]  # named before it ran


def test_the_host_table_names_each_row_not_run_yet(tmp_path, monkeypatch):
    """HOST.md is rewritten after every row; until a row has run it names it as not run, so a step stopped at its time
    limit (the GPU kit's) leaves a table that says which rows it never reached."""
    import throughput

    tables = []

    def host_run(script, flags, iterations, batch, workdir, device, env):
        tables.append((workdir / "HOST.md").read_text() if (workdir / "HOST.md").exists() else "")
        return {"sps": 50.0, "alone_sps": 100.0}

    monkeypatch.setattr(throughput, "host_run", host_run)
    argv = ["throughput.py", "--suite", "host", "--quick", "--reps", "1", "--out", str(tmp_path), "--only", "lean",
            "rollout plain"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    throughput.main()
    assert tables[0] == ""  # nothing written before the first row
    assert "| PPO lean (ppo_procgen.py) | 50 | 100 | 0.50 |" in tables[1]
    assert f"| PPO full, --rollout plain | {throughput.NOT_RUN} |" in tables[1]
    assert throughput.NOT_RUN not in (tmp_path / "HOST.md").read_text()  # every row ran


def test_the_machine_table_measures_four_runs_first_and_lists_the_rows_in_order(tmp_path, monkeypatch):
    """The machine full: four runs at once first (the figure a GPU machine's target is set in), one alone next (each
    row's ratio is against it), so that a kit step stopped at its time limit has measured those two; the table lists
    the rows in order whatever order they ran in, one that timed out or has not run yet said so."""
    import throughput

    ran, tables = [], []

    def together(n, flags, iterations, batch, opts):
        tables.append((tmp_path / "MACHINE.md").read_text() if ran else "")
        ran.append(n)
        if n == 2:
            raise TimeoutError
        return {"total": 100.0 * n, "per_run": 100.0}

    monkeypatch.setattr(throughput, "together", together)
    argv = ["throughput.py", "--suite", "machine", "--reps", "1", "--timeout", "60", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="1 row"):  # the one that timed out
        throughput.main()
    assert ran == [4, 1, 2, 3]
    rows = [line.split("|")[1:-1] for line in tables[1].splitlines() if line[:2] == "| " and line[2].isdigit()]
    assert [int(row[0]) for row in rows] == [1, 2, 3, 4] and rows[3][1].strip() == "400", rows  # four, measured first
    assert all(throughput.NOT_RUN in row[1] for row in rows[:3]), rows
    final = (tmp_path / "MACHINE.md").read_text()
    assert "| 1 | 100 | 100 | 1.00x |" in final and "| 4 | 400 | 100 | 4.00x |" in final and "| 2 | timed out" in final


def test_the_gpu_table_warms_the_cache_once_and_names_the_cuda_graphs_skipped(tmp_path, monkeypatch):
    """The GPU suite's compiled rows: one untimed compiled iteration of PPO and one of PPG at once before the first
    of them (and only then), their seconds under the table; a CUDA-graph row whose run said inductor skipped graphs is
    named with the count and the first reason, one that said none is named as such. `run` counts the skips from the
    run's stderr."""
    import types

    import throughput

    scalars = {f"perf/{k}_seconds": 0.5 for k in ("env", "inference", "eval", "update", "iteration")}
    acc = types.SimpleNamespace(Tags=lambda: {"scalars": list(scalars)},
                                Scalars=lambda tag: [types.SimpleNamespace(step=1, value=scalars[tag])])  # fmt: skip
    stderr = "W1126 skipping cudagraphs due to mutated inputs (1 instances)\nother\nskipping cudagraphs due to cpu\n"

    def logged(said):  # a run whose events are `scalars` and whose stderr is `said`
        return lambda *a: ("", types.SimpleNamespace(ru_maxrss=2**20), acc, said)

    monkeypatch.setattr(throughput, "run_logged", logged(stderr))
    result = throughput.run("ppo_procgen_full", [], 2, 100, tmp_path)
    assert result["cudagraph_skips"] == 2 and "mutated inputs" in result["skip_reason"]

    calls, real_run = [], throughput.run

    def run(script, flags, iterations, batch, workdir, device="cpu", env=None, timeout=None, timed=1):
        calls.append((flags, iterations, timed))
        if "bf16" in flags:  # this row's run says inductor skipped two graphs
            return real_run(script, flags, iterations, batch, workdir, device, env, timeout, timed)
        monkeypatch.setattr(throughput, "run_logged", logged(""))
        result = real_run(script, flags, iterations, batch, workdir, device, env, timeout, timed)
        monkeypatch.setattr(throughput, "run_logged", logged(stderr))
        return result

    monkeypatch.setattr(throughput, "run", run)
    monkeypatch.setattr(throughput, "ceiling", lambda *a: 1000.0)
    only = ["PPO eager, --rollout plain", "PPO default", "PPG default", "CUDA graphs (--compile reduce-overhead)"]
    argv = ["throughput.py", "--suite", "gpu", "--device", "cuda", "--reps", "1", "--out", str(tmp_path), "--only",
            *only]  # fmt: skip
    monkeypatch.setattr(throughput, "machine", lambda device: "a test machine")
    monkeypatch.setattr(sys, "argv", argv)
    throughput.main()
    warm_up = [c for c in calls if c[1] == 1]  # PPO's and PPG's (a phase of one iteration), at once, before the first
    assert sorted("--n-iteration" in c[0] for c in warm_up) == [False, True]
    assert all("reduce-overhead" in c[0] for c in warm_up) and {calls.index(c) for c in warm_up} == {1, 2}
    assert [(iterations, timed) for _, iterations, timed in calls] == [(3, 2), (1, 1), (1, 1), *[(3, 2)] * 6]
    table = (tmp_path / "GPU_SPEED.md").read_text()
    for name in ("PPO", "PPG"):
        said = f"Warm-up: one iteration of {name} with `--compile reduce-overhead --rollout folded` from a cold cache"
        assert re.search(rf"{re.escape(said)}, \d+ s", table), table
    assert "bf16: inductor skipped 2 CUDA graph(s); the first said `W1126 skipping cudagraphs due to mutated" in table
    assert "(--compile reduce-overhead), --rollout plain: no CUDA graph skipped" in table
    assert "folded): no CUDA graph skipped" in table  # the defaults' row: CUDA graphs, its flags none
    assert "(the lean loop): no CUDA graph" not in table  # eager: no graphs to skip


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.mark.parametrize(
    "module,waits_in,call",
    [
        ("throughput", "wait4", lambda module, tmp_path: module.run_logged(SLEEPER, tmp_path)),
        ("gpu", "communicate", lambda module, tmp_path: module.run_step(SLEEPER, 60, dict(os.environ))),
    ],
    ids=["speed row", "kit step"],
)
def test_a_run_in_a_session_of_its_own_is_stopped_by_ctrl_c(module, waits_in, call, tmp_path, monkeypatch):
    """A speed row's run and a kit step start in sessions of their own (so that a time limit can stop the whole
    group): a Ctrl-C that stops the benchmark while it waits stops them too, which the terminal's signal would not."""
    module, started, popen = __import__(module), [], subprocess.Popen
    ctrl_c = lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt())  # noqa: E731
    monkeypatch.setattr(os if waits_in == "wait4" else popen, waits_in, ctrl_c)
    monkeypatch.setattr(module.subprocess, "Popen", lambda *a, **k: started.append(popen(*a, **k)) or started[-1])
    with pytest.raises(KeyboardInterrupt):
        call(module, tmp_path)
    monkeypatch.undo()
    assert started[0].wait(timeout=10) == -signal.SIGKILL


def test_the_loop_cost_benchmark_writes_its_table(tmp_path):
    """`loop_cost.py --quick`: each row's microseconds per rollout step, from train() on games that answer at once."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "loop_cost.py"), "--quick", "--out", str(tmp_path), "--only",
           "PPO lean", "PPO full, --rollout plain"]  # fmt: skip
    proc = run_routed(cmd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in (tmp_path / "LOOP.md").read_text().splitlines() if line.startswith("| ")]
    assert [row[0].strip() for row in rows[1:]] == ["PPO lean", "PPO full, --rollout plain"]
    assert all(float(row[1]) > 0 for row in rows[1:])


def test_compiled_runs_keep_their_stages_in_the_campaign_s_cache(tmp_path, monkeypatch):
    """A campaign's run whose flags compile gets the campaign's inductor and Triton caches (a run that does not: none,
    as nothing is kept); the GPU kit's speed step compiles into the campaign's cache at its default `--work` (a check
    on a CPU: none), so that a campaign after the kit starts warm."""
    import argparse
    import types

    import gpu
    import learning

    cache = tmp_path / "compile_cache"
    assert learning.cache_env(cache) == {
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "TRITON_CACHE_DIR": str(cache / "triton"),
    }
    # the campaign hands each run its environment: three runs of a plan, one compiled, each done at once
    plan = [{"script": "ppo_procgen_full", "env_id": game, "seed": 1, "total_timesteps": 128, "flags": flags}
            for game, flags in (("starpilot", ["--seed", "1", "--compile", "reduce-overhead"]), ("bigfish", []),
                                ("coinrun", ["--compile", "off"]))]  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps({"runs": plan}))
    envs = {}

    class Done:  # a chunk whose process has ended, done
        def __init__(self, key, run, work, extra, interval, env):
            self.key, self.proc, self.at_once, envs[key] = key, types.SimpleNamespace(poll=lambda: 0), 1, env
            (work / key).mkdir(parents=True)

        def read(self):
            pass

        def phase_seconds(self):
            return 0.0

        def close(self, window):
            return False

    argv = ["campaign", "--budget", "600", "--plan", str(tmp_path / "plan.json"), "--work", str(tmp_path / "work"),
            "--state", str(tmp_path / "state"), "--report", str(tmp_path / "report")]  # fmt: skip
    monkeypatch.setattr(learning, "Chunk", Done)
    monkeypatch.setattr(learning, "check_script_flags", lambda *a: None)
    monkeypatch.setattr(learning, "write_campaign_report", lambda *a: None)
    learning.campaign(*learning.parse(argv))
    assert envs["starpilot__ppo_procgen__1"]["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "work" / "compile_cache")
    for key in ("bigfish__ppo_procgen__1", "coinrun__ppo_procgen__1"):  # the campaign's own, whatever it is
        assert envs[key].get("TORCHINDUCTOR_CACHE_DIR") == os.environ.get("TORCHINDUCTOR_CACHE_DIR"), key
    kit = argparse.Namespace(quick=False, out=tmp_path)
    default_work = learning.parse(["campaign", "--budget", "0"])[0].work
    assert gpu.step_env("Speed options", kit) == learning.cache_env(default_work / learning.COMPILE_CACHE)
    assert gpu.step_env("CUDA tests", kit) == {} and gpu.step_env("Speed options", argparse.Namespace(quick=True)) == {}
    # the kit itself, its steps' commands stood in for: the speed step's runs get the cache, the others none
    steps = []
    monkeypatch.setattr(gpu, "run_step", lambda cmd, limit, env: steps.append((cmd, env)) or (0, "1 passed"))
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--out", str(tmp_path / "kit")])
    with pytest.raises(SystemExit) as kit_ended:
        gpu.main()
    assert kit_ended.value.code == 0 and len(steps) == 3
    cache = [env.get("TORCHINDUCTOR_CACHE_DIR") for _, env in steps]
    assert cache[1] == str(default_work / learning.COMPILE_CACHE), cache
    assert cache[0] == cache[2] == os.environ.get("TORCHINDUCTOR_CACHE_DIR"), cache
    # a window short of time reruns the CUDA tests that failed: `--tests` is the test step's -k
    first = steps[0][0]
    assert first[first.index("-k") + 1] == "cuda or gpu"
    steps.clear()
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--out", str(tmp_path / "kit"), "--tests", "cuda and separate"])
    with pytest.raises(SystemExit):
        gpu.main()
    assert steps[0][0][steps[0][0].index("-k") + 1] == "cuda and separate"


def campaign_stood_in(monkeypatch, tmp_path, plan, process, clock):
    """`learning`, set to run a campaign of `plan` whose runs' processes are `process` and whose clock is `clock` (its
    `time.time()`, a list of one number), which each of the campaign's waits of 0.1 s moves on: when anything happens
    is known to a wait, whatever the machine's load. The folders' flags, each in `tmp_path`."""
    import types

    import learning

    (tmp_path / "plan").write_text(json.dumps({"runs": plan}))
    tick = types.SimpleNamespace(time=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(learning, "time", tick)
    monkeypatch.setattr(learning.subprocess, "Popen", process)
    # no process of its own: a pid past the kernel's largest (2^22), which /proc has not and no signal reaches
    monkeypatch.setattr(process, "pid", getattr(process, "pid", 2**22 + 1), raising=False)
    monkeypatch.setattr(learning, "check_script_flags", lambda *a: None)
    monkeypatch.setattr(learning, "write_campaign_report", lambda *a: None)
    return [x for name in ("plan", "work", "state", "report") for x in (f"--{name}", str(tmp_path / name))]


def test_a_campaign_stops_ppg_at_its_phase_end_and_earlier_than_ppo(tmp_path, monkeypatch, capsys):
    """A PPG run's chunk is told to stop at its phase's end (a checkpoint inside a phase holds its rollouts, up to 6.25
    GiB, which cannot travel), fresh or resumed, and is asked to stop `--phase-margin` seconds before a PPO run; a run
    starts only with `--margin` seconds to run before it is asked to stop, and one that cannot is named. The runs'
    processes are stood in for, and the campaign's clock: each of its waits moves it on, so that when each run was
    asked to stop is known to a wait, whatever the machine's load."""
    import learning

    plan = [{"script": f"{name}_full", "env_id": "starpilot", "seed": 1, "total_timesteps": 10**6}
            for name in ("ppg_procgen", "ppo_procgen")]  # fmt: skip
    (tmp_path / "work" / "starpilot__ppg_procgen__1" / "runs" / "x" / "checkpoints").mkdir(parents=True)
    (tmp_path / "work" / "starpilot__ppg_procgen__1" / "runs" / "x" / "checkpoints" / "iter_00000032.pt").touch()
    started, stopped = {}, {}

    class Process:  # runs until asked to stop, then ends as a stopped run ends
        def __init__(self, cmd, cwd, **kwargs):
            self.key, self.returncode = os.path.basename(cwd), None
            started[self.key] = cmd

        def poll(self):
            return self.returncode

        def send_signal(self, signum):
            stopped[self.key] = round(deadline - clock[0], 6)
            self.returncode = 128 + signum

    clock = [1000.0]
    folders = campaign_stood_in(monkeypatch, tmp_path, plan, Process, clock)
    argv = ["campaign", "--budget", "4", "--margin", "0.5", "--phase-margin", "1", *folders]
    deadline = clock[0] + 4
    learning.campaign(*learning.parse(argv))
    ppo, ppg = started["starpilot__ppo_procgen__1"], started["starpilot__ppg_procgen__1"]
    assert "--stop-at-phase-end" not in ppo and ppg[ppg.index("--resume") :][2:] == ["--stop-at-phase-end"], ppg
    # at the first wait's end after 1.5 s (PPG) and 0.5 s (PPO) before the budget's
    assert 1.4 <= stopped["starpilot__ppg_procgen__1"] <= 1.5 and 0.4 <= stopped["starpilot__ppo_procgen__1"] <= 0.5
    # 1.8 s: enough for PPO (0.5 + 0.5), which starts though PPG comes first, not for PPG (1.5 + 0.5)
    started.clear()
    argv[argv.index("--budget") + 1] = "1.8"
    deadline = clock[0] + 1.8
    learning.campaign(*learning.parse(argv))
    assert list(started) == ["starpilot__ppo_procgen__1"], started
    assert "not started, too little time left: starpilot__ppg_procgen__1" in capsys.readouterr().out
    started.clear()  # a budget of 0, the report alone: nothing starts, and no run is said to be left out
    argv[argv.index("--budget") + 1] = "0"
    learning.campaign(*learning.parse(argv))
    assert not started and "not started" not in capsys.readouterr().out


def ppg_on_the_clock(clock, stopped):
    """A stand-in PPG run's process on the campaign's `clock`: iterations of 1 s of 1,000 steps (its console's s/iter
    says 2, 3, 1, 2, ... s: what it logs, not the clock), with 3 s of auxiliary phase after every fourth, which logs
    its phase line at its end; asked to stop, it goes on to its phase's end and ends there as a stopped run ends
    (`--stop-at-phase-end`); `stopped` gets the clock when it was asked."""

    class Process:
        phases, signum = 0, None  # the phase lines logged; the signal it was asked to stop with

        def __init__(self, cmd, cwd, **kwargs):
            self.log, self.start, self.logged, self.returncode = os.path.join(cwd, "log.txt"), clock[0], 0, None

        def poll(self):
            k = self.logged + 1  # iteration k ends at k seconds, plus 3 s for each phase before it
            while self.returncode is None and self.start + k + 3 * ((k - 1) // 4) <= clock[0]:
                with open(self.log, "a") as f:
                    seconds = 1 + k % 3  # the console's
                    f.write(
                        f"iter {k}/1000  step {1000 * k}  SPS 1000  ({seconds}.0s/iter, 9.9 min left)  return 0.00\n"
                    )
                self.logged, k = k, k + 1
            phases = (clock[0] - self.start) // 7  # each phase's line, at its auxiliary epochs' end
            while self.returncode is None and self.phases < phases:
                self.phases += 1
                with open(self.log, "a") as f:
                    f.write(f"phase {self.phases}/250  kl_loss 0.001\n")
                self.returncode = 128 + self.signum if self.signum else None
            return self.returncode

        def send_signal(self, signum):
            stopped["at"], self.signum = clock[0], signum

    return Process


def test_a_campaign_s_pace_is_on_the_clock_auxiliary_phases_included(tmp_path, monkeypatch):
    """A run's pace in campaign.json is its steps over the clock's seconds from its first iteration's end to its last's,
    or to its last auxiliary phase's end: a stand-in PPG run logs 4,000 steps in 7 s (4 iterations and an auxiliary
    phase), stopped at a phase's end: about 571 steps/s over its 5 phases (19,000 steps in 34 s: 559), where the
    iterations' own seconds said 1,000 (the pace before 2026-11-28, which would have planned PPG's windows at PPO's
    pace) and its iterations' ends alone 19,000 steps in 31 s (about 610: the pace before 2026-11-29). The chunk's
    record says where and when it ran, its steps, iterations and their console seconds, and CAMPAIGN.md lists it."""
    import learning

    plan = [{"script": "ppg_procgen_full", "env_id": "starpilot", "seed": 1, "total_timesteps": 10**6}]
    clock = [1000.0]
    folders = campaign_stood_in(monkeypatch, tmp_path, plan, ppg_on_the_clock(clock, {}), clock)
    learning.campaign(*learning.parse(["campaign", "--budget", "40", "--margin", "1", "--phase-margin", "1", *folders]))
    status = json.loads((tmp_path / "work" / "starpilot__ppg_procgen__1" / "campaign.json").read_text())
    assert status["step"] == 20_000 and 550 <= status["speed"]["steps_per_second"] <= 570, status
    [record] = status["chunks_run"]
    when = "1970-01-01 00:16"  # the stand-in clock's 1000 s
    assert record["began"] == when and record["machine"] == learning.machine_name() and record["budget"] == 40, record
    assert record["torch"] == importlib.metadata.version("torch"), record
    # 20 iterations logged at 2, 3, 1, ... s: seven of 2 s, seven of 3 s and six of 1 s; no checkpoint is written
    assert record["seconds_per_iteration"] == [2.0, 1.0, 3.0] and record["iterations"] == 20, record
    assert record["steps"] == [0, 0] and record["how"] == "stopped at a checkpoint" and record["runs_at_once"] == 1
    line = learning.each_chunk(learning.plan_runs(tmp_path / "plan"), tmp_path / "work")[-1]
    assert line.startswith(f"| starpilot__ppg_procgen__1 | 1 | {when} to "), line
    assert "| 40 | 0 to 0 | 20 | 2.0 (1.0 to 3.0) |" in line, line


@pytest.mark.parametrize("budget", [40, 20])
def test_a_campaign_asks_ppg_to_stop_a_whole_phase_before_the_end_where_a_phase_outlasts_the_phase_margin(
    budget, tmp_path, monkeypatch
):
    """A PPG run asked to stop goes on to its phase's end: asked `--phase-margin` seconds ahead where its phases are
    longer (a 2-core CPU's: about 110 minutes), it reaches none in time, is killed, and the chunk's phases since its
    last checkpoint are lost. Its phases of 7 s on the clock: asked 1 + 7 s before the budget's end, not 1 + 1, from its
    first phase's end on (a budget of 20 s: asked in its second phase, which a measure from two phase ends would see
    end first)."""
    import learning

    plan = [{"script": "ppg_procgen_full", "env_id": "starpilot", "seed": 1, "total_timesteps": 10**6}]
    clock, stopped = [1000.0], {}
    folders = campaign_stood_in(monkeypatch, tmp_path, plan, ppg_on_the_clock(clock, stopped), clock)
    argv = ["campaign", "--budget", str(budget), "--margin", "1", "--phase-margin", "1", *folders]
    learning.campaign(*learning.parse(argv))
    assert 7.9 <= 1000 + budget - stopped["at"] <= 8.2, stopped  # within two waits


@pytest.mark.parametrize("killer", ["outside", "campaign"])
def test_a_campaign_says_when_a_run_was_killed_by_a_signal_it_did_not_send_with_the_run_s_peak_memory(
    killer, tmp_path, monkeypatch
):
    """A run killed by a SIGKILL the campaign did not send (the kernel's out-of-memory killer sends one) is named so in
    its note, with its peak resident memory at the campaign's last look and the machine's; one the campaign killed,
    too late for its checkpoint, plainly. Every chunk's peak is kept in campaign.json. The stand-in run has this
    test's process's pid, whose peak (VmHWM) the campaign reads; it ends 1 s in (`outside`), or when it is killed."""
    import learning

    plan = [{"script": "ppo_procgen_full", "env_id": "starpilot", "seed": 1, "total_timesteps": 10**6}]
    clock = [1000.0]

    class Process:
        pid = os.getpid()

        def __init__(self, cmd, cwd, **kwargs):
            self.start, self.returncode = clock[0], None

        def poll(self):
            if killer == "outside" and clock[0] >= self.start + 1:
                self.returncode = -signal.SIGKILL
            return self.returncode

        def send_signal(self, signum):  # a stop asked: not heard
            pass

    folders = campaign_stood_in(monkeypatch, tmp_path, plan, Process, clock)
    started = []
    monkeypatch.setattr(learning.subprocess, "Popen", lambda *a, **k: started.append(Process(*a, **k)) or started[-1])
    killed = lambda pid, signum: setattr(started[0], "returncode", -signum)  # noqa: E731
    monkeypatch.setattr(learning.os, "killpg", killed)  # the campaign's SIGKILL, to the stand-in
    learning.campaign(*learning.parse(["campaign", "--budget", "40", "--margin", "1", *folders]))
    status = json.loads((tmp_path / "work" / "starpilot__ppo_procgen__1" / "campaign.json").read_text())
    hwm = int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())[1]) / 2**20
    peak, machine = float(status["memory"]["peak"].split()[0]), learning.machine_memory() / 2**30
    assert 0.05 <= peak <= hwm + 0.05 and status["memory"]["of"] == f"{machine:.1f} GiB", status
    by = (
        f" by a SIGKILL the campaign did not send ({peak:.1f} GiB resident at the last look, of the machine's "
        f"{machine:.1f} GiB: near it, the kernel's out-of-memory killer)"
    )
    assert status["notes"] == [
        f"chunk 1 killed before its checkpoint{by if killer == 'outside' else ''}: goes on from iteration 0"
    ], status
    assert status["chunks_run"][0]["how"] == "killed" and status["chunks_run"][0]["peak"] == status["memory"]["peak"]


def test_the_campaign_reads_each_run_once_at_its_own_step_and_sets_runs_of_a_game_and_seed_side_by_side(
    tmp_path, monkeypatch
):
    """PPO logged to step 1000 and PPG to 600 on starpilot at seed 1: each run at its own last step beside the
    reference there, then those two read up to 600; the runs without a partner (another seed, another game) are in the
    first table alone. Every run's events are read once."""
    learning = __import__("learning")
    # PPO: an episode returning k ends at step 100 k, so its curve at 100 k is (k + 1) / 2; PPG's episodes return 5
    runs = [
        ("ppo_procgen", "starpilot", 1, 1000, lambda k: k),
        ("ppg_procgen", "starpilot", 1, 600, lambda k: 5),
        ("ppo_procgen", "starpilot", 2, 300, lambda k: 1),
        ("ppo_procgen", "caveflyer", 1, 300, lambda k: 1),
    ]
    plan = [
        {"script": f"{name}_full", "env_id": game, "seed": seed, "total_timesteps": 1000}
        for name, game, seed, *_ in runs
    ]
    (tmp_path / "plan.json").write_text(json.dumps({"runs": plan}))
    plan = learning.plan_runs(tmp_path / "plan.json")
    for name, game, seed, last, episode in runs:
        steps = range(100, last + 1, 100)
        events = {"charts/SPS": [(s, 1) for s in steps]}
        events["charts/episodic_return"] = [(step, float(episode(k))) for k, step in enumerate(steps, 1)]
        if (name, seed) == ("ppo_procgen", 1):  # halfway up starpilot's easy range (2.5, 64): a score of 0.5
            events["charts/test_episodic_return"] = [(step, 33.25) for step in steps]
        key = f"{game}__{name}__{seed}"
        write_run(tmp_path / "work" / key / "runs" / f"{key}__1", events)
    flat = lambda value: [(0, value), (2000, value)]  # noqa: E731
    # the reference runs' test returns average 23: a score of 20.5 / 61.5 = 0.333
    ref = {("starpilot", "train"): [flat(0.0), flat(2.0), flat(4.0)], ("starpilot", "test"): [flat(2.5)] * 2}
    write_reference(tmp_path / "ref.csv.gz", {**ref, ("starpilot", "test"): [*ref["starpilot", "test"], flat(64.0)]})
    # where the campaign left them: PPO seed 1 with its checkpoint at iteration 8 of the 10 it logged, PPG killed with
    # none kept after its first chunk, whose peak memory the campaign read; the others without a campaign.json
    statuses = {
        "starpilot__ppo_procgen__1": {"iteration": 8, "step": 1000, "logged_iteration": 10, "chunks": 2},
        "starpilot__ppg_procgen__1": {
            "step": 600,
            "logged_iteration": 6,
            "chunks": 1,
            "notes": ["killed", "again"],
            "memory": {"chunk": 1, "peak": "23.1 GiB", "of": "23.5 GiB"},
        },
    }
    for key, status in statuses.items():
        (tmp_path / "work" / key / "campaign.json").write_text(json.dumps(status))
    read = []
    monkeypatch.setattr(learning, "read_runs", lambda dirs, real=learning.read_runs: read.extend(dirs) or real(dirs))
    monkeypatch.setattr(learning, "report", lambda opts: None)  # the groups' reports: tested above
    opts = argparse.Namespace(
        report=tmp_path / "out", work=tmp_path / "work", title="t", reference=tmp_path / "ref.csv.gz"
    )
    learning.write_campaign_report(opts, plan)
    text = (tmp_path / "out" / "CAMPAIGN.md").read_text()
    where, each, beside = (section.split("\n## ")[0] for section in text.split("## ")[0:3])

    def table(section):
        return [[c.strip() for c in row.split("|")[1:-1]] for row in section.splitlines() if row.startswith("| ")]

    assert [row[3:] for row in table(where)[1:3]] == [
        ["1,000 (kept: 800)", "1,000", "no", "2", "", "", ""],
        ["600 (kept: 0)", "1,000", "no", "1", "", "23.1 GiB of 23.5 GiB (chunk 1)", "killed; again"],
    ]
    assert [row[3] for row in table(where)[3:]] == ["0", "0"]  # no campaign.json: nothing reached

    # PPO seed 1 at 1000: inside at 7 of its 10 points (up to 4.0); the last tenth of 1000 steps is step 1000 alone
    test, test_late = ["33.25", "2.50 to 64.00"], ["33.25 / 23.00", "0.500 / 0.333"]  # PPO seed 1's test cells
    assert table(each)[1:] == [
        ["starpilot__ppo_procgen__1", "1,000", "5.50", "0.00 to 4.00", *test, "70% / 100%", "5.50 / 2.00", *test_late],
        ["starpilot__ppg_procgen__1", "600", "5.00", "0.00 to 4.00", "-", "-", "0% / -", "5.00 / 2.00", "-", "-"],
        ["starpilot__ppo_procgen__2", "300", "1.00", "0.00 to 4.00", "-", "-", "100% / -", "1.00 / 2.00", "-", "-"],
        ["caveflyer__ppo_procgen__1", "300", "-", "-", "-", "-", "- / -", "-", "-", "-"],
    ]
    assert table(beside)[1:] == [
        ["starpilot, 1", "PPO", "600", "3.50", "0.00 to 4.00", *test, "100% / 100%", "3.50 / 2.00", *test_late],
        ["starpilot, 1", "PPG", "600", "5.00", "0.00 to 4.00", "-", "-", "0% / -", "5.00 / 2.00", "-", "-"],
    ]
    assert sorted(d.name for d in read) == sorted(f"{game}__{name}__{seed}" for name, game, seed, *_ in runs)


def test_the_campaign_sets_each_ppg_run_phase_by_phase_beside_the_ppo_run_of_its_game_and_seed(tmp_path, monkeypatch):
    """Each PPG run with events gets `phases/KEY.md`: beside the PPO run of its game, seed and group (not another
    seed's), or alone; a PPO run gets none."""
    learning = __import__("learning")
    runs = [
        ("ppg_procgen", "starpilot", 1),
        ("ppo_procgen", "starpilot", 2),
        ("ppo_procgen", "starpilot", 1),
        ("ppg_procgen", "bigfish", 1),
        ("ppo_procgen", "bossfight", 1),
    ]
    plan = [
        {"script": f"{name}_full", "env_id": game, "seed": seed, "total_timesteps": 1000} for name, game, seed in runs
    ]
    (tmp_path / "plan.json").write_text(json.dumps({"runs": plan}))
    plan = learning.plan_runs(tmp_path / "plan.json")
    for name, game, seed in runs:  # PPG's phases end at 200 and 400; each PPO run's episodes return its seed
        key, steps = f"{game}__{name}__{seed}", range(100, 401, 100)
        events = {"charts/SPS": [(s, 1) for s in steps], "charts/episodic_return": [(s, float(seed)) for s in steps]}
        for loss in ("kl_loss", "aux_value_loss", "real_value_loss") if name == "ppg_procgen" else ():
            events[f"losses/aux/{loss}"] = [(200, 0.5), (400, 0.25)]
        write_run(tmp_path / "work" / key / "runs" / f"{key}__1", events)
    write_reference(tmp_path / "ref.csv.gz", {("starpilot", "train"): [[(0, 0.0), (2000, 0.0)]] * 3})
    monkeypatch.setattr(learning, "report", lambda opts: None)  # the groups' reports: tested above
    opts = argparse.Namespace(
        report=tmp_path / "out", work=tmp_path / "work", title="t", reference=tmp_path / "ref.csv.gz"
    )
    learning.write_campaign_report(opts, plan)
    assert sorted(p.name for p in (tmp_path / "out" / "phases").iterdir()) == [
        "bigfish__ppg_procgen__1.md",
        "starpilot__ppg_procgen__1.md",
    ]
    text = (tmp_path / "out" / "phases" / "starpilot__ppg_procgen__1.md").read_text()
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| 2 | 400 ")]
    assert "- PPO: `starpilot__ppo_procgen__1__1`" in text  # seed 1's, not seed 2's
    # phase 2: its real_value_loss; the last 100 episodes' means, PPG's and PPO's (seed 1's); the reference's range
    assert rows[0][4:5] + rows[0][-3:] == ["0.2500", "1.00", "1.00", "0.00 to 0.00"], rows
    assert "- PPO: none given" in (tmp_path / "out" / "phases" / "bigfish__ppg_procgen__1.md").read_text()


def test_a_campaign_cut_into_chunks_logs_what_the_same_run_logs_uninterrupted(tmp_path):
    """Quick mode: a PPO run of 5 tiny iterations, stopped by the campaign after 2 of them (it writes its checkpoint
    and exits), packed into parts under the size limit; its folder then lost, as on another machine, and resumed from
    the parts to the end: every statistic logged equals the same run's in one chunk. A run done is not started again.
    The campaign's own inductor cache is packed and travels with the runs (planted here: the quick runs compile
    nothing)."""
    flags = smoke_args("ppo_procgen_full")
    del flags[flags.index("--total-timesteps") : flags.index("--total-timesteps") + 2]  # the plan's total
    run = {"script": "ppo_procgen_full", "env_id": "starpilot", "seed": 1, "total_timesteps": 5 * 128, "flags": flags}
    (tmp_path / "plan.json").write_text(json.dumps({"runs": [run]}))
    key, limit = "starpilot__ppo_procgen__1", 2**20

    def campaign(state, *more):
        cmd = [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "campaign", "--budget", "600", "--plan",
               str(tmp_path / "plan.json"), "--state", str(tmp_path / state), "--work", str(tmp_path / f"{state}_work"),
               "--report", str(tmp_path / f"{state}_report"), "--part-mb", "1", *more]  # fmt: skip
        proc = run_routed(cmd, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    cache = tmp_path / "chunked_work" / "compile_cache"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "entry").write_text("a compiled stage")
    out = campaign("chunked", "--chunk-iterations", "2")
    assert "compile_cache: packed into" in out and (tmp_path / "chunked" / "compile_cache.tar.xz.001of001").is_file()
    assert f"{key}: starts" in out and "this window's runs, up to 1 at once:" in out
    first = json.loads((tmp_path / "chunked_work" / key / "campaign.json").read_text())
    assert not first["done"] and first["iteration"] in (2, 3) and first["step"] == 128 * first["iteration"]
    # the run's pace after its first iteration, what a window on a GPU machine measures of it (runs at once: one)
    assert first["speed"]["steps_per_second"] > 0 and first["speed"]["runs_at_once"] == 1, first
    pace = f"| {first['speed']['steps_per_second']:,}, 1 run(s) at once |"
    assert pace in (tmp_path / "chunked_report" / "CAMPAIGN.md").read_text()
    # and its peak memory in the table (its figure is the fork server's client's here, as `routed` says: not checked)
    memory = f"| {first['memory']['peak']} of {first['memory']['of']} (chunk 1) |"
    assert memory in (tmp_path / "chunked_report" / "CAMPAIGN.md").read_text()
    parts = sorted((tmp_path / "chunked").iterdir())
    assert len(parts) > 1 and all(p.stat().st_size <= limit for p in parts)  # a checkpoint of ~6 MB, in parts
    shutil.rmtree(tmp_path / "chunked_work")  # another machine: the packed parts alone travel
    assert f"{key}: resumes from" in campaign("chunked")
    assert (cache / "fxgraph" / "entry").read_text() == "a compiled stage"
    # the log travels with the run: each chunk's command as run from a checkout, no path of this machine in it
    log = (tmp_path / "chunked_work" / key / "log.txt").read_text().splitlines()
    headers = [line for line in log if line.startswith("# campaign, chunk ")]
    assert [h.split(":")[0] for h in headers] == ["# campaign, chunk 1", "# campaign, chunk 2"], headers
    assert all(h.split(": ", 1)[1].startswith("python ppo_procgen_full.py --") for h in headers), headers
    assert not any(str(ROOT) in h or sys.executable in h for h in headers), headers
    again = campaign("chunked")
    assert "starts" not in again and "resumes" not in again  # done: never again
    campaign("whole")

    def logged(state):
        (run_dir,) = (tmp_path / f"{state}_work" / key / "runs").iterdir()
        scalars = read_scalars(run_dir)
        return {tag: v for tag, v in scalars.items() if not tag.startswith("perf/") and tag != "charts/SPS"}

    chunked, whole = logged("chunked"), logged("whole")
    assert chunked == whole and [s for s, _ in whole["losses/value_loss"]] == [128 * i for i in range(1, 6)]
    status = json.loads((tmp_path / "chunked_work" / key / "campaign.json").read_text())
    assert status["done"]
    # each chunk's record, which travels with the run: the steps its checkpoints kept, and how it ended
    records = [(c["steps"], c["how"]) for c in status["chunks_run"]]
    assert records == [([0, first["step"]], "stopped at a checkpoint"), ([first["step"], 640], "done")], records
    assert (tmp_path / "chunked_report" / "CAMPAIGN.md").read_text().count(f"| {key} | ") == 4  # 2 chunks: 2 more
    curves = (tmp_path / "chunked_report" / "defaults" / "curves.csv").read_text().splitlines()
    assert [line.split(",")[3] for line in curves[1:]] == [str(128 * i) for i in range(1, 6)]  # every logged step
    assert all(p.stat().st_size <= limit for p in (tmp_path / "chunked").iterdir())


def test_a_packed_run_s_events_travel_folded_and_read_back_as_they_were(tmp_path, monkeypatch):
    """`pack` folds a run's event files into arrays (`history.npz`) and `unpack` writes them out again: TensorBoard
    then reads every scalar at its step with its value, its wall time to the millisecond, the hyperparameters' text,
    and what a resume's purge dropped stays dropped; a later resume's purge still drops the unfolded events after its
    step. Values that share a step and a wall time are one event again (an episode's return and length); packed, the
    folded events take under a third of the event files' bytes (3,000 episodes here)."""
    import learning
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter

    def read(run_dir):
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        scalars = {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
        texts = {tag: [(e.step, e.tensor_proto.string_val) for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}
        return scalars, texts

    def chunk(run_dir, first, last, purge_step=None):  # iterations first..last of 1,000 steps, 300 episodes each
        writer = SummaryWriter(str(run_dir), purge_step=purge_step)
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n|chunk from|{first}|")
        for iteration in range(first, last + 1):
            step = 1000 * iteration
            writer.add_scalar("losses/value_loss", 1 / iteration, step)
            for n in range(300):  # an episode's return and length in one event, as the full files write them
                r, length = (iteration * 7 + n) % 31, float(n % 97)
                values = [
                    Summary.Value(tag=f"charts/episodic_{k}", simple_value=v)
                    for k, v in (("return", r), ("length", length))
                ]
                writer.file_writer.add_summary(Summary(value=values), step)
        writer.close()

    key, work, state = "starpilot__ppo_procgen__1", tmp_path / "work", tmp_path / "state"
    run_dir = work / key / "runs" / "starpilot__ppo_procgen__1__1"
    chunk(run_dir, 1, 6)
    time.sleep(1.1)  # the resume's file, named by its second, sorts after the first
    chunk(run_dir, 5, 10, purge_step=5000)  # resumed from iteration 4: the first chunk's 5 and 6 are dropped
    (work / key / "campaign.json").write_text(json.dumps({"iteration": 10}))
    before = read(run_dir)
    assert [s for s, _, _ in before[0]["losses/value_loss"]] == [1000 * i for i in range(1, 11)]
    state.mkdir()
    with monkeypatch.context() as patched:  # the event files as they are, packed
        patched.setattr(learning, "fold_events", lambda run_dir: None)
        unfolded = learning.pack(work, state, key, 2**20)
    assert learning.pack(work, state, key, 2**20) < unfolded / 3
    with tarfile.open(fileobj=open(next(state.iterdir()), "rb"), mode="r:xz") as tar:
        names = tar.getnames()
    assert f"{key}/runs/{run_dir.name}/history.npz" in names and not [n for n in names if "tfevents" in n], names
    shutil.rmtree(work)  # another machine
    learning.unpack(state, work)
    assert sorted(p.name for p in run_dir.iterdir()) == [learning.HISTORY_EVENTS]
    unfolded_events = list(EventFileLoader(str(run_dir / learning.HISTORY_EVENTS)).Load())
    assert len(unfolded_events) <= 1 + 2 + 10 * 301  # its version, the texts, each step's loss and episodes (paired)
    after = read(run_dir)
    assert after[1] == before[1] and after[0].keys() == before[0].keys()
    for tag, events in before[0].items():
        assert [(s, v) for s, v, _ in after[0][tag]] == [(s, v) for s, v, _ in events], tag
        assert max(abs(a[2] - b[2]) for a, b in zip(after[0][tag], events, strict=True)) <= 0.0005, tag
    chunk(run_dir, 9, 11, purge_step=9000)  # the next window resumes from iteration 8
    assert [s for s, _, _ in read(run_dir)[0]["losses/value_loss"]] == [1000 * i for i in range(1, 12)]


def test_a_window_runs_a_campaign_chunk_and_the_kit_s_tests_at_once_and_leaves_what_comes_back(tmp_path):
    """`window.sh` rehearsed on the CPU (the kit's quick mode, a plan of two tiny runs): both runs go at once within
    the budget, the selected test runs beside them, and OUT holds at most 8 files: each run's parts, `window.tgz` with
    the report and the kit's GPU.md, the two consoles."""
    flags = smoke_args("ppo_procgen_full")
    del flags[flags.index("--total-timesteps") : flags.index("--total-timesteps") + 2]  # the plan's total
    run = {"script": "ppo_procgen_full", "seed": 1, "total_timesteps": 3 * 128, "flags": flags}
    runs = [{**run, "env_id": game} for game in ("starpilot", "bossfight")]
    (tmp_path / "plan.json").write_text(json.dumps({"runs": runs}))
    keys = ["starpilot__ppo_procgen__1", "bossfight__ppo_procgen__1"]
    where = {name: str(tmp_path / name.lower()) for name in ("STATE", "WORK")} | {"PLAN": str(tmp_path / "plan.json")}
    window = {
        "BUDGET": "40",
        "CAMPAIGN_FLAGS": "--margin 15",
        "TESTS": "smoke and ppo and cpu and not (full or vtrace or prio or rnd or bf16)",
        "QUICK": "1",
    }
    env = {**routing()[0], **where, **window, "PYTHON": sys.executable}  # the runs and the tests: through a fork server
    cmd = ["bash", str(ROOT / "benchmarks" / "window.sh"), str(tmp_path / "out"), *keys]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    out = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(out) <= 8 and {"window.tgz", "campaign_console.txt", "kit_console.txt"} <= set(out), out
    assert all(any(name.startswith(f"{key}.tar.xz.") for name in out) for key in keys), out
    console = (tmp_path / "out" / "campaign_console.txt").read_text()
    assert "this window's runs, up to 2 at once" in console, console
    with tarfile.open(tmp_path / "out" / "window.tgz") as tar:
        tar.extractall(tmp_path / "back", filter="data")
    assert re.search(r"\b1 passed", (tmp_path / "back" / "kit" / "GPU.md").read_text())
    report = (tmp_path / "back" / "report" / "CAMPAIGN.md").read_text()
    assert all(f"| {key} |" in report for key in keys), report


def test_a_slimmed_procgen_keeps_its_games_frames_and_the_campaign_refuses_the_others(tmp_path, capsys, monkeypatch):
    """slim_procgen.py on a package packed from the procgen installed here: the backgrounds starpilot does not draw
    become 1x1, its frames stay the same bit for bit while a game drawing a replaced folder's change (the check can
    fail), and a campaign with that package refuses any other game before it unpacks or starts anything."""
    from importlib.util import find_spec

    import slim_procgen

    if find_spec("procgen") is None:  # Python 3.13's procgen-gym: its games in another package
        pytest.skip("no procgen package to slim")
    site = Path(find_spec("procgen").origin).parent.parent
    pack = tmp_path / "procgen.tar"
    with tarfile.open(pack, "w") as t:
        for top in [site / "procgen", *site.glob("procgen*.libs")]:
            t.add(top, arcname=top.name)
    slim_procgen.main([str(pack), "--games", "starpilot", "--steps", "20"])
    out = capsys.readouterr().out
    assert "starpilot: the same frames" in out and "bigfish (not kept): its frames changed" in out, out
    with tarfile.open(pack) as t:
        t.extractall(tmp_path / "slim", filter="tar")
    assets, kept = tmp_path / "slim" / "procgen" / "data" / "assets", site / "procgen" / "data" / "assets"
    assert (assets / "water_backgrounds" / "water1.png").read_bytes() == slim_procgen.tiny_png()
    assert (assets / "platform_backgrounds" / "alien_bg.png").read_bytes() == slim_procgen.tiny_png()
    for name in ("space_backgrounds/deep_space_01.png", "kenney/Tiles/lava.png"):
        assert (assets / name).read_bytes() == (kept / name).read_bytes(), name
    assert slim_procgen.slim_games(tmp_path / "slim" / "procgen") == ["starpilot"]
    assert slim_procgen.slim_games(site / "procgen") is None
    slim_procgen.main([str(pack), "--games", "starpilot"])  # slimmed already: said, and left as it is
    assert "slimmed already" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="slimmed for starpilot: gather the full package again"):
        slim_procgen.main([str(pack), "--games", "starpilot", "coinrun"])

    import learning

    work = tmp_path / "work"
    only = ["--only", "starpilot__ppo_procgen__1", "bigfish__ppo_procgen__1"]
    folders = ["--work", str(work), "--state", str(tmp_path / "state"), "--report", str(tmp_path / "report")]
    argv = ["campaign", "--budget", "1", *folders, *only]  # a second: were the game let through, nothing would start
    monkeypatch.setattr(slim_procgen, "slim_games", lambda: ["starpilot"])
    with pytest.raises(SystemExit, match=r"campaign: this procgen is slimmed for starpilot .*not \['bigfish'\]"):
        learning.campaign(*learning.parse(argv))
    runs = tmp_path / "runs"  # and `run` (`--env-ids all`: the 16 games), before it starts or makes anything

    def started(*args, **kwargs):  # were the games let through, the test fails here instead of training them
        raise AssertionError(f"a run started: {args[0]}")

    monkeypatch.setattr(learning.subprocess, "Popen", started)
    with pytest.raises(SystemExit, match=r"run: this procgen is slimmed for starpilot .*not \['bigfish', 'bossfight'"):
        learning.run(*learning.parse(["run", "--env-ids", "all", "--runs", str(runs)]))
    assert not work.exists() and not runs.exists()


def test_a_failing_test_s_reason_is_written_as_it_fails(tmp_path):
    """The GPU kit's CUDA tests may be stopped at the step's time limit, before pytest writes any failure's reason:
    with TESTS_FAILURES_FILE set, tests/conftest.py writes each one's as it fails. A test that fails, then one that
    never ends: the first's assertion is in the file while pytest still runs the second; with it, the line of a
    script's file it went through, dozens of frames above the end (a compiler's failure ends deep in torch)."""
    (tmp_path / "procgen_planted.py").write_text("import deep\n\ndef update():\n    deep.down(40)\n")
    (tmp_path / "deep.py").write_text("def down(n):\n    assert n, 'planted reason'\n    down(n - 1)\n")
    (tmp_path / "test_planted.py").write_text(
        "import time\n\nimport procgen_planted\n\ndef test_fails():\n    procgen_planted.update()\n\n"
        "def test_never_ends():\n    time.sleep(600)\n"
    )
    reasons = tmp_path / "failures.log"
    env = {**os.environ, "TESTS_FAILURES_FILE": str(reasons), "PYTHONPATH": str(ROOT / "tests")}
    cmd = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-o", "addopts=", "-q"]
    with subprocess.Popen([*cmd, "test_planted.py"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL) as proc:
        try:
            deadline = time.time() + 60
            while "planted reason" not in (reasons.read_text() if reasons.exists() else "") and time.time() < deadline:
                time.sleep(0.2)
            assert proc.poll() is None  # pytest is still in the second test
        finally:
            proc.kill()
    text = reasons.read_text()
    assert "test_planted.py::test_fails (call)" in text and "planted reason" in text and "never_ends" not in text
    assert "procgen_planted.py:4: in update" in text and text.count("deep.py:3: in down") < 40
