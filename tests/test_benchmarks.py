"""The benchmarks run and write well-formed results (their timings are never asserted)."""

import re
import subprocess
import sys

from conftest import ROOT, smoke_args

sys.path.insert(0, str(ROOT / "benchmarks"))


def test_throughput_quick_writes_a_table_and_a_chart(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--quick", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "RESULTS.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| configuration")]
    names = [row.split("|")[1].strip() for row in rows]
    assert names == [name for name, _, _ in __import__("throughput").CONFIGS]
    for row in rows:  # steps/s, ratio, env, inference, update: positive numbers
        cells = [c.strip() for c in row.split("|")[2:-1]]
        assert float(cells[0]) > 0 and re.fullmatch(r"\d+\.\d\dx", cells[1])
        assert all(float(c) >= 0 for c in cells[2:5]) and float(cells[-1]) > 0
    assert "PPG" not in rows[0] and any(row.split("|")[7].strip() for row in rows if "PPG" in row)  # aux epoch timed
    assert re.search(r"Ceiling, procgen alone .*\d steps/s with 1 thread", text)
    assert (tmp_path / "throughput.png").read_bytes()[:4] == b"\x89PNG"


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
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        [c.strip() for c in line.split("|")[1:-1]] for line in out.read_text().splitlines() if line.startswith("| ")
    ]
    return [r for r in rows if r[0].startswith(("losses/", "perf/"))], [
        r for r in rows if re.fullmatch(r"[\d,]+", r[0])
    ]


def test_learning_report_from_smoke_runs(tmp_path):
    runs, learning = tmp_path / "runs_dir", ROOT / "benchmarks" / "learning.py"
    for name in ("ppo_procgen", "ppg_procgen"):  # real small runs, each with its own smoke flags
        cmd = [sys.executable, str(learning), "run", "--scripts", name, "--env-ids", "starpilot", "--seeds", "1",
               "--total-timesteps", "256", "--random-episodes", "20", "--runs", str(runs), "--",
               *smoke_args(name)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = [sys.executable, str(learning), "report", "--runs", str(runs), "--out", str(tmp_path), "--title", "smoke"]
    proc = subprocess.run(report, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in (tmp_path / "LEARNING.md").read_text().splitlines()
            if line.startswith("| starpilot")]  # fmt: skip
    assert [(r[0].strip(), r[1].strip(), r[2].strip(), r[3].strip()) for r in rows] == [
        ("starpilot", "PPO", "1", "256"),
        ("starpilot", "PPG", "1", "256"),
    ]
    assert all(float(r[7]) > 0 for r in rows)  # the random policy's return on the same levels
    assert (tmp_path / "learning.png").read_bytes()[:4] == b"\x89PNG"

    # compare: a run against itself differs nowhere; PPO against PPG differs
    ppg_run, ppo_run = sorted((runs / "runs").iterdir())
    stats, per_iteration = compare_rows(ppo_run, ppo_run, tmp_path / "same.md")
    assert [r[0] for r in stats] == list(__import__("learning").COMPARED)
    assert all(r[1] == r[2] and float(r[3]) == 0 and float(r[4]) == 0 for r in stats)
    assert [r[0] for r in per_iteration] == ["128", "256"] and all(r[1] == r[2] and r[3] == r[4] for r in per_iteration)
    stats, per_iteration = compare_rows(ppo_run, ppg_run, tmp_path / "algorithms.md")
    assert len(stats) == 6 and all(float(r[4]) > 0 for r in stats if r[0] != "losses/clipfrac")
    assert len(per_iteration) == 2 and per_iteration[0][1] != per_iteration[0][2]  # approx_kl
