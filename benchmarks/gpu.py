"""The GPU kit: on a machine with an NVIDIA GPU, in one command (meant to end within 10 minutes on one H100), the checks
and the figures that a CPU cannot give, gathered in GPU.md with the GPU, torch and the commands named:

    python benchmarks/gpu.py            # the CUDA tests, the speed options on cuda, the machine full
    python benchmarks/gpu.py --quick    # the same steps at tiny sizes on the CPU: checks that the kit runs

The steps, each timed, each one's output kept beside GPU.md:
  1. the CUDA tests: `python -m pytest -k "cuda or gpu"` (or `--tests EXPR`: a window short of time reruns those
     that failed), tests/test_gpu.py's first (the GPU's defaults), the
     host-sync tests among them (no host-device sync between two minibatches; a rollout step waits no more than its
     copies back);
  2. `throughput.py --suite gpu --device cuda --reps 3 --only ...`: the lean loop, then PPO's GPU defaults (CUDA
     graphs and the folded rollout), PPG's two alike over whole phases, then PPO's defaults with torch's CPU threads on
     every core (the default before one thread), each the mean of whole iterations after a warm-up, the rows
     alternating (the table's other rows, each option alone: the same command without `--only`);
     inductor's cache filled first by one untimed compiled iteration of PPO and one of PPG, at once; each run killed
     past `--row-timeout` (2 minutes), a failing one written with its exit status and last stderr lines, the CUDA
     graphs that inductor skipped named. Whether the GPU's defaults are faster than the lean loop is read here;
  3. `throughput.py --suite machine --device cuda`: 4, 1, 2 and 3 runs of PPO at once (four first), the machine's total.
The host side (`throughput.py --suite host --device cuda`: each script's loop without the network, beside procgen
alone) is not a step: it needs a minute or more, which the kit's 10 minutes do not have.
A failing step is reported and the kit goes on with the next; it exits 1 if any failed. A failing test's reason is
written as it fails (`TESTS_FAILURES_FILE`, tests/conftest.py) and copied into GPU.md, so that a test step stopped at
its limit still says why. Each step has a time limit
(`--timeout`, seconds; the three defaults sum to 9.5 minutes): one that hangs is stopped with every process it
started, reported as timed out in GPU.md with the output it gave, and the kit goes on. Every table is written as soon
as it has a row and again after each, naming the rows not run yet (a step stopped at its limit leaves them named);
GPU.md after every step.
"""

import argparse
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent


# each step's time limit in seconds, meant for one H100: the kit's whole run within 10 minutes
# (the first run, on an H200, 2026-11-26, with 150, 300, 75 and 45: the CUDA tests and the host side ran out, the
# speed table measured 5 of its rows, the host-sync tests took 25 s)
# (2026-11-27: the machine-full step added, 120 s for its four rows; the others cut to keep the sum at 9.5 minutes)
# (2026-11-27: four speed rows 3 times each, the lean loop and the GPU's defaults, about 6 minutes on a GPU machine
# by estimate (a row's start, its warm compile, 3 iterations); the machine full gets a minute, the host side and the
# host-sync tests, measured before, what is left)
# (2026-11-27: the H200 run of 2026-11-27 stopped the CUDA tests at 91% of 120 s, with no failure's reason; now 150 s,
# each reason written as the test fails, and 30 s less for the speed table, whose PPG default row ran out anyway)
# (2026-11-27: the host side and the host-sync tests, 15 s each, gave nothing on the H200 (a step's start takes longer):
# the host side left out (`throughput.py --suite host --device cuda` alone, when a window has the time), the host-sync
# tests among the CUDA tests, their seconds to the speed table, which has a fifth row)
TIMEOUTS = {"CUDA tests": 160, "Speed options": 345, "Machine full": 65}


def run_step(cmd, timeout, env):
    """Run `cmd` in a process group of its own; after `timeout` seconds stop the group (the benchmark's and the tests'
    children too). (exit status or None when it timed out, its output)."""
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=True) as proc:  # fmt: skip
        try:
            output = proc.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return None, proc.communicate()[0]
        except BaseException:  # Ctrl-C: the step, in a session of its own, does not get it from the terminal
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    return proc.returncode, output


QUICK_ROWS = ["PPO default (", "PPO eager, --rollout folded", "PPO eager, --rollout plain"]
# the kit's speed rows, 3 repetitions each: the lean loop and the GPU's defaults, PPO's and PPG's, and last (the step's
# limit cuts the last rows) PPO's defaults with torch's CPU threads on every core, as before one thread became a GPU's
# default (the others, each option alone, once: `throughput.py --suite gpu --device cuda`)
KIT_ROWS = ["PPO eager, --rollout plain", "PPO default (", "PPG eager", "PPG default", "PPO default, torch's"]


def steps(opts):
    """(title, command, the table it writes or None): what the kit runs, in order. A check on a CPU (`--quick`) runs
    one test file's CUDA cases (skipped there), three eager rows of the speed options and the machine full, tiny."""
    bench = [
        sys.executable,
        str(HERE / "throughput.py"),
        "--device",
        opts.device,
        "--out",
        str(opts.out),
        "--reps",
        "1",
    ]
    # -v: each test's outcome on its own line as it ends, so that a step stopped at its limit still names them
    pytest = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:benchmark"]
    quick = ["--quick"] if opts.quick else []
    # test_gpu.py's first (their order is the workers' order): whether the GPU's defaults log the eager loop's numbers;
    # the kit's own tests left out (they would run a nested kit)
    apart = ("test_gpu.py", "test_benchmarks.py")
    files = sorted(f"tests/{path.name}" for path in (ROOT / "tests").glob("test_*.py") if path.name not in apart)
    tests = ["tests/test_smoke.py"] if opts.quick else ["tests/test_gpu.py", *files]
    serial = ["-n", "0"] if opts.quick else []  # a check on a CPU skips every CUDA case: no worker per core
    rows = ["--only", *(QUICK_ROWS if opts.quick else KIT_ROWS)]
    reps = [] if opts.quick else ["--reps", "3"]  # the speed rows repeated, alternating (the other steps: once)
    return [
        # each test's outcome in cuda_tests.xml when the step ends, in its log as it goes
        (
            "CUDA tests",
            [*pytest, *tests, *serial, "-k", opts.tests, "--junitxml", str(opts.out / "cuda_tests.xml")],
            None,
        ),
        (
            "Speed options",
            [*bench, "--suite", "gpu", "--timeout", str(opts.row_timeout), *quick, *rows, *reps],
            "GPU_SPEED.md",
        ),
        ("Machine full", [*bench, "--suite", "machine", *quick], "MACHINE.md"),
    ]


def step_env(title, opts):
    """What a step's environment adds: the speed step's compiled stages go into the campaign's compile cache (they are
    the campaign's runs': a campaign after the kit loads them); a check on a CPU compiles nothing, and adds none."""
    if title != "Speed options" or opts.quick:
        return {}
    import learning  # beside this file

    return learning.cache_env(learning.WORK / learning.COMPILE_CACHE)


# a game made and stepped, as every step will: on one GPU machine procgen's library could not load (libGL.so.1
# missing) and every step failed for that alone
GAMES_LOAD = (
    "from ppo_procgen import ProcgenVecEnv as E; e = E(1, 0, env_name='coinrun', distribution_mode='easy'); "
    "e.reset(); e.step([0])"
)


def failed_tests(output):
    """The tests that failed or erred, by name, from pytest's verbose output (its lines as each test ends, with or
    without workers, and its summary): each once, in order."""
    found = {}
    for line in output.splitlines():
        outcome, test = re.search(r"\b(FAILED|ERROR)\b", line), re.search(r"tests/\S+::\S+", line)
        if outcome and test:
            found.setdefault(test[0], f"{outcome[1]} {test[0]}")
    return list(found.values())


def gpu_name(device):
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(torch.device(device))}, CUDA {torch.version.cuda}"
    return f"no GPU: {platform.processor() or platform.machine()} CPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes on the CPU: checks that the kit runs")
    parser.add_argument("--out", type=Path, default=None, help="where GPU.md and the tables go (gpu/; quick: quick/)")
    parser.add_argument("--skip", nargs="*", default=[], metavar="TITLE", help="steps to leave out, by title")
    tests_help = "pytest's -k for the CUDA tests step: a window short of time reruns those that failed"
    parser.add_argument("--tests", default="cuda or gpu", metavar="EXPR", help=tests_help)
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="every step's time limit (default: each step's own, 9.5 minutes in all)")  # fmt: skip
    parser.add_argument("--row-timeout", type=float, default=120, metavar="SECONDS",
                        help="the time limit of one run of the speed table (default 120)")  # fmt: skip
    opts = parser.parse_args()
    opts.device = "cpu" if opts.quick else "cuda"
    opts.out = (opts.out or HERE / ("quick" if opts.quick else "gpu")).resolve()
    opts.out.mkdir(parents=True, exist_ok=True)
    stale_files = ("GPU.md", "GPU_SPEED.md", "MACHINE.md", "cuda_tests.xml", "*.log")
    for stale in stale_files:  # no table of an earlier run
        for path in opts.out.glob(stale):
            path.unlink()
    import torch

    lines = [
        "# The GPU kit" + (" (quick mode: tiny sizes on the CPU, not a measurement)" if opts.quick else ""),
        "",
        f"Device: {gpu_name(opts.device)}; {os.cpu_count()} CPU cores; Python {platform.python_version()}, torch "
        f"{torch.__version__}. Command: `python benchmarks/gpu.py{' --quick' if opts.quick else ''}`, "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
    ]
    games = subprocess.run([sys.executable, "-c", GAMES_LOAD], capture_output=True, text=True, cwd=ROOT)
    if games.returncode != 0:  # every step would fail on it: said at once, before the machine's time goes
        why = (games.stderr.strip().splitlines() or ["(no output)"])[-1]
        (opts.out / "GPU.md").write_text("\n".join([*lines, f"procgen does not load: `{why}`", ""]))
        raise SystemExit(f"gpu.py: procgen does not load, so no step can run: {why}")
    failed = []
    for title, cmd, table in steps(opts):
        if title in opts.skip:
            continue
        start, limit = time.time(), opts.timeout or TIMEOUTS[title]
        log = opts.out / f"{title.lower().replace(' ', '_').replace('-', '_')}.log"
        # each failing test's reason as it fails (tests/conftest.py): pytest's own come at its end, which a step
        # stopped at its limit never reaches
        reasons = log.with_suffix(".failures.log")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TESTS_FAILURES_FILE": str(reasons)}
        env |= step_env(title, opts)
        status, output = run_step(cmd, limit, env)
        seconds = time.time() - start
        log.write_text(output)
        ok = status == 0 or (cmd[1:3] == ["-m", "pytest"] and status == 5)  # 5: all deselected
        failed += [] if ok else [title]
        summary = (output.strip().splitlines() or ["(no output)"])[-1]
        verdict = "ok" if ok else f"TIMED OUT after {limit:g} s" if status is None else f"FAILED (exit {status})"
        print(f"{title}: {verdict} in {seconds:.0f} s: {summary}", flush=True)
        lines += [f"## {title}", "", f"`{' '.join(Path(c).name if c.startswith('/') else c for c in cmd)}`: "
                  f"{verdict.lower()}, {seconds:.0f} s; `{summary}`", ""]  # fmt: skip
        failures = failed_tests(output)
        lines += [f"- {failure}" for failure in failures] + ([""] if failures else [])
        if reasons.exists():  # the reasons, each failure's last lines
            lines += ["Why, as each failed:", "", "```", *reasons.read_text().splitlines()[:200], "```", ""]
        if table and (opts.out / table).exists():
            lines += [line for line in (opts.out / table).read_text().splitlines()[2:]] + [""]
        (opts.out / "GPU.md").write_text("\n".join(lines))  # after every step: a later step's fault keeps it
    print(f"wrote {opts.out / 'GPU.md'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
