"""What only a GPU can check: the speed options as a GPU runs them. The compiled stages with CUDA graphs
(`--compile reduce-overhead`: each stage's graph recorded at its second call, replayed after it, none skipped) and
the folded rollout trains, with finite losses (a rollout step's waits on the GPU: test_host_syncs.py).
Whether the GPU's defaults (the fast path) log the eager plain rollout's numbers, up to float rounding. Every case
is skipped without a GPU; run on a CPU with `--device cpu`, the CUDA-graph check failed as it should (a CPU run
skips every graph: 11 in PPG's), and each assertion says what a GPU run saw."""

import signal

import numpy as np
import pytest
import torch
from conftest import GPU, assert_trained, load_script, parse, read_scalars, smoke_args
from test_checkpoint import after, sigterm_at_call
from test_compile import OPTIONS as PPO_OPTIONS
from test_compile import PPG_OPTIONS, RND_START

pytestmark = pytest.mark.skipif(not GPU, reason="no GPU")

THREE = ["--total-timesteps", str(4 * 32 * 3)]  # the graphs recorded in the first iteration, replayed after
PPG_PHASE = ["--n-iteration", "1"]  # PPG closes a phase every iteration: its auxiliary graphs replay in the third


# the algorithm's options at the GPU's defaults (CUDA graphs, folded), as test_compile.py runs them on a CPU
OPTIONS = {"ppo_procgen_full": [*PPO_OPTIONS, *RND_START], "ppg_procgen_full": [*PPG_OPTIONS, *RND_START]}


@pytest.mark.parametrize(
    "name,compile_mode,rollout,extra",
    # each rollout with and without compiling (one compiled iteration at the default sizes took 110 s on an H200
    # with inductor's cache cold: the kit's step has time for few compiles; at these sizes, seconds)
    [
        ("ppo_procgen_full", "default", "folded", []),
        ("ppg_procgen_full", "reduce-overhead", "plain", []),
        ("ppo_procgen_full", "off", "folded", []),
        ("ppg_procgen_full", "off", "folded", []),
        ("ppo_procgen_full", "auto", "auto", OPTIONS["ppo_procgen_full"]),
        ("ppg_procgen_full", "auto", "auto", OPTIONS["ppg_procgen_full"]),
    ],
)
def test_the_gpu_speed_options_train_on_cuda(name, compile_mode, rollout, extra, tmp_path, monkeypatch):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    flags = [*smoke_args(name), *THREE, *(PPG_PHASE if "ppg" in name else []), "--device", "cuda", *extra]
    run_name = script.train(parse(script, [*flags, "--compile", compile_mode, "--rollout", rollout]))
    scalars = read_scalars(tmp_path / "runs" / run_name)
    assert_trained(scalars, iterations=3)
    if "ppg" in name:
        assert [step for step, _ in scalars["losses/aux/kl_loss"]] == [128, 256, 384]
    # a graph that inductor skips (an operation it cannot capture, a CPU tensor in the graph) is said on stderr and
    # counted; the run still trains, eagerly, so the count is the only sign
    skipped = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] - skips
    assert skipped == 0 or compile_mode == "off", f"{skipped} CUDA graph(s) skipped: see the log above"


@pytest.mark.parametrize(
    "fast",
    [[], ["--rollout", "plain"]],
    ids=["defaults", "graphs-plain"],
)
def test_the_gpu_defaults_log_the_eager_plain_rollout_s_numbers(fast, tmp_path, monkeypatch):
    """The GPU's defaults (issues 72 and 73): PPO at its defaults on a GPU (`--compile auto --rollout auto`: CUDA
    graphs and the folded rollout), and with CUDA graphs and the plain rollout, against the eager plain rollout
    (`--compile off --rollout plain`, the lean file's loop) at the same seed, three iterations with the test envs:
    every loss and return within float rounding grown over Adam's steps (the CPU's compiled-stages test allows 2e-3
    over two iterations). The folded rollout draws its noise ahead
    a step's at a time, as the plain loop draws it: where this fails for the defaults and not for the plain rollout,
    the folded rollout parts them (a GPU may round a batch of another size, the test envs', otherwise)."""
    script = load_script("ppo_procgen_full")
    flags = [*smoke_args("ppo_procgen_full"), *THREE, "--device", "cuda", "--num-eval-envs", "4"]
    tags = ("losses/", "charts/episodic", "charts/test_episodic")
    logged = {}
    for name, options in (("eager", ["--compile", "off", "--rollout", "plain"]), ("fast", fast)):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        args = parse(script, [*flags, *options])
        scalars = read_scalars(tmp_path / name / "runs" / script.train(args))
        logged[name] = {tag: [v for _, v in rows] for tag, rows in scalars.items() if tag.startswith(tags)}
    assert (args.compile, args.rollout) == ("reduce-overhead", fast[1] if fast else "folded")
    assert logged["eager"]["losses/approx_kl"][-1] > 0 and logged["fast"].keys() == logged["eager"].keys()
    for tag, values in logged["eager"].items():
        np.testing.assert_allclose(logged["fast"][tag], values, rtol=2e-3, atol=1e-5, err_msg=tag)


@pytest.mark.parametrize("name", ["ppo_procgen_full", "ppg_procgen_full"])
def test_a_run_at_the_gpu_defaults_resumes_where_it_stopped(name, tmp_path, monkeypatch):
    """The campaign's chunks at the GPU's defaults (CUDA graphs, folded): a run stopped by SIGTERM in its third
    iteration (PPG: inside its second phase) and resumed logs what the uninterrupted run logs after the checkpoint,
    bit for bit, as the eager loop does (tests/test_checkpoint.py); where it does not, the message says by how much."""
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    flags = [*smoke_args(name), "--total-timesteps", "512", "--device", "cuda"]  # 4 iterations; PPG: 2 phases
    straight = script.train(parse(script, [*flags, "--exp-name", "straight"]))
    compute_gae = script.compute_gae
    sigterm_at_call(monkeypatch, script, "compute_gae", 3)  # the advantages stay eager, where the signal is raised
    with pytest.raises(SystemExit) as stop:
        script.train(parse(script, [*flags, "--exp-name", "stopped"]))
    assert stop.value.code == 128 + signal.SIGTERM
    monkeypatch.setattr(script, "compute_gae", compute_gae)
    (run_dir,) = (tmp_path / "runs").glob("*stopped*")
    script.train(parse(script, [*flags, "--exp-name", "stopped", "--resume", str(run_dir)]))
    a, b = after(read_scalars(tmp_path / "runs" / straight), 384), after(read_scalars(run_dir), 384)
    for tag in [tag for tag in a if tag.startswith(("losses/", "charts/episodic", "charts/test_episodic"))]:
        ours, theirs = [v for _, v in b[tag]], [v for _, v in a[tag]]
        gap = max((abs(x - y) for x, y in zip(ours, theirs, strict=False)), default=0.0)
        assert ours == theirs, f"{tag}: resumed {ours} against {theirs} (largest difference {gap:.3g})"
