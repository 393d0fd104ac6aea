"""The cold compile time of each compiled stage (`--compile`), at the default sizes, through the script's own train():

    python benchmarks/compile_time.py                      # PPO and PPG, --compile default, on the CPU
    python benchmarks/compile_time.py --device cuda --mode reduce-overhead

Each script runs one iteration (PPG: a phase of one iteration and one auxiliary epoch), one update epoch, with
inductor's cache in a fresh folder, so every stage compiles from nothing. Every call of every stage is timed (on a GPU,
synchronised); a stage's compile time is its first call's time less the median of its later calls (the work the call
does), for each input shape the stage met (the policy step meets two: the training envs' and the test envs'). The
table goes to COMPILE.md in --out (this folder's quick/ subfolder by default, git-ignored).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {
    "ppo_procgen_full": ["--update-epochs", "1"],
    "ppg_procgen_full": ["--n-iteration", "1", "--e-auxiliary", "1"],
}


def timed_run(script, device, mode):
    """A child process: the script's train() with torch.compile wrapped so that each compiled stage's calls are timed;
    prints one line per stage and input shape: name, shape, calls, first call's seconds, the later calls' median."""
    import importlib.util

    import torch

    sys.path.insert(0, str(ROOT))  # where a full file finds plumbing.py
    spec = importlib.util.spec_from_file_location(script, ROOT / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls, compile_ = {}, torch.compile

    def shape_of(args):
        tensors = [a for a in torch.utils._pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]
        return tuple(tensors[0].shape) if tensors else ()

    def timing_compile(fn, **kwargs):
        compiled = compile_(fn, **kwargs)

        def timed(*args):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = compiled(*args)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            calls.setdefault((fn.__name__, shape_of(args[1:])), []).append(time.perf_counter() - start)
            return out

        return timed

    torch.compile = timing_compile
    batch = 64 * 256
    flags = ["--total-timesteps", str(batch), "--device", device, "--compile", mode, *SCRIPTS[script]]
    module.train(module.plumbing.parse_args(module.Args, [*flags, "--exp-name", "compile_time"]))
    for (name, shape), seconds in calls.items():
        later = statistics.median(seconds[1:]) if len(seconds) > 1 else 0.0
        print(f"STAGE {name} {'x'.join(map(str, shape))} {len(seconds)} {seconds[0]:.2f} {later:.4f}", flush=True)


def main():
    if sys.argv[1:2] == ["--child"]:
        return timed_run(*sys.argv[2:5])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default="default", choices=["default", "reduce-overhead"])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "quick")
    opts = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput import machine

    rows = []
    for script in SCRIPTS:
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as cwd:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": f"{cache}/triton"}
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--child", script, opts.device, opts.mode], cwd=cwd,
                                  env=env, capture_output=True, text=True)  # fmt: skip
            whole = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{script} failed:\n{proc.stderr[-3000:]}")
        for line in proc.stdout.splitlines():
            if line.startswith("STAGE "):
                name, shape, count, first, later = line.split()[1:]
                compile_s = float(first) - float(later)
                rows.append(f"| {script}.py | `{name}` | {shape} | {count} | {float(first):.1f} | {float(later):.3f} | "
                            f"{compile_s:.1f} |")  # fmt: skip
                print(rows[-1], flush=True)
        rows.append(f"| {script}.py | the whole run | | | {whole:.0f} | | |")
    lines = [
        "# Cold compile times of the compiled stages",
        "",
        f"Machine: {machine(opts.device)}.  ",
        f"Command: `python benchmarks/compile_time.py --device {opts.device} --mode {opts.mode}`, "
        f"{time.strftime('%Y-%m-%d')}. One iteration at the default sizes (64 envs x 256 steps, 8 minibatches; "
        "one update epoch; PPG a phase of one iteration and one auxiliary epoch), inductor's cache empty. Compile: "
        "the first call's seconds less the later calls' median, per stage and first input's shape.",
        "",
        "| script | stage | first input's shape | calls | first call s | later calls s (median) | compile s |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "COMPILE.md").write_text("\n".join(lines))
    print(f"wrote {opts.out / 'COMPILE.md'}")


if __name__ == "__main__":
    main()
