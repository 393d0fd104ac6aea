"""The CUDA paths that a CPU can exercise: which GPU a torchrun process takes, the flag combinations that would reach
NCCL wrong, the random state a checkpoint keeps, and what bf16 autocast covers. torch's CUDA queries are stood in for
where a GPU would answer them."""

import contextlib
import types

import pytest
import torch
from conftest import MonkeyPatch, load_script, narrow_lean, parse, read_scalars, smoke_args
from scripted_env import Recorder

FULL = ["ppo_procgen_full", "ppg_procgen_full"]
SCRIPTS = ["ppo_procgen", "ppg_procgen", *FULL]


@pytest.fixture
def gpus(monkeypatch):
    """Pretend that CUDA is there with `count` GPUs; record what asks for a GPU by index, and (`.threads`) the CPU
    threads torch is asked for, which this process keeps."""
    asked, threads = [], []

    def with_count(count):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", lambda index: asked.append(index))
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**36, 2**36))  # for the memory check
        monkeypatch.setattr(torch, "set_num_threads", threads.append)
        return asked

    with_count.threads = threads
    return with_count


def devices_answer(monkeypatch):
    """`torch.zeros(0, device=D)` answers with D, as it would where D exists: the device check passes."""
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **k: type("T", (), {"device": device})())


def torchrun_env(monkeypatch, local_rank, world_size):
    for key, value in (("LOCAL_RANK", local_rank), ("RANK", local_rank), ("WORLD_SIZE", world_size)):
        monkeypatch.setenv(key, str(value))


@pytest.mark.parametrize("name", FULL)
def test_a_cpu_process_under_torchrun_asks_for_no_gpu(name, gpus, monkeypatch, tmp_path, capsys):
    """Two CPU processes on a one-GPU machine: rank 1 must not ask for GPU 1. Through `train()`, which stops at the
    evaluation of a checkpoint that is not there, after the device is settled."""
    asked = gpus(1)
    torchrun_env(monkeypatch, 1, 1)
    monkeypatch.chdir(tmp_path)
    script = load_script(name)
    with pytest.raises(SystemExit):
        script.train(parse(script, [*smoke_args(name), "--device", "cpu", "--eval-only", "missing.pt"]))
    assert asked == [] and "--eval-only" in capsys.readouterr().err


@pytest.mark.parametrize("name", FULL)
@pytest.mark.parametrize(
    "local_rank,world_size,flags,message",
    [
        (1, 2, ["--device", "auto"], "LOCAL_RANK 1 has no GPU: 1 visible"),
        (0, 2, ["--device", "cuda:0"], "each process takes its local rank's GPU: --device cuda"),
        (None, None, ["--device", "cpu", "--backend", "nccl"], "--backend nccl: reduces GPU tensors"),
    ],
)
def test_gpu_flag_combinations_that_would_go_wrong_are_one_line(
    name, local_rank, world_size, flags, message, gpus, monkeypatch, capsys
):
    asked = gpus(1)
    if local_rank is not None:
        torchrun_env(monkeypatch, local_rank, world_size)
    script = load_script(name)
    with pytest.raises(SystemExit) as stop:
        script.check_args(parse(script, [*smoke_args(name), *flags]))
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and message in lines[0], lines
    assert asked == []  # refused before any GPU was set


@pytest.mark.parametrize("name", FULL)
@pytest.mark.parametrize(
    "local_rank,world_size,device,asked_for",
    [(1, 2, "cuda", [1]), (0, 1, "cuda:1", [])],  # rank 1 of 2 takes GPU 1; one process keeps the GPU it was given
)
def test_a_torchrun_process_takes_its_local_rank_s_gpu(name, local_rank, world_size, device, asked_for, gpus,
                                                       monkeypatch):  # fmt: skip
    asked = gpus(2)
    torchrun_env(monkeypatch, local_rank, world_size)
    devices_answer(monkeypatch)
    script = load_script(name)
    args = parse(script, [*smoke_args(name), "--device", device])
    script.check_args(args)
    assert asked == asked_for and args.device == "cuda:1"


# (processes, flags, what --compile, --rollout and --torch-threads become): on a GPU torch's CPU threads are one
FAST_PATH = [
    (1, ["--device", "cuda"], ("reduce-overhead", "folded", 1)),  # one process on a GPU: the fast path
    (2, ["--device", "cuda"], ("off", "plain", 1)),  # torchrun: the lean loop
    (1, ["--device", "cpu"], ("off", "plain", 0)),  # torch's own threads
    (1, ["--device", "cuda", "--compile", "default", "--rollout", "plain"], ("default", "plain", 1)),
    (1, ["--device", "cuda", "--torch-threads", "3"], ("reduce-overhead", "folded", 3)),
    (1, ["--device", "cpu", "--torch-threads", "1"], ("off", "plain", 1)),
]
PPG_ACCUMULATES = (1, ["--device", "cuda", "--n-aux-grad-accum", "2"], ("off", "folded", 1))  # no CUDA graphs


@pytest.mark.parametrize(
    "name,world_size,flags,chosen",
    [(name, *case) for name in FULL for case in FAST_PATH] + [("ppg_procgen_full", *PPG_ACCUMULATES)],
)
def test_a_gpu_s_defaults_are_the_fast_path_and_a_cpu_s_the_lean_loop(name, world_size, flags, chosen, gpus,
                                                                     monkeypatch):  # fmt: skip
    """`--compile auto`, `--rollout auto` and `--torch-threads 0`, the defaults, as `check_args` settles them on the
    device of the run; torch is asked for that many threads (0: none asked, torch's own)."""
    gpus(2)
    torchrun_env(monkeypatch, 0, world_size)
    devices_answer(monkeypatch)
    script = load_script(name)
    args = parse(script, [*smoke_args(name), *flags])
    script.check_args(args)
    assert (args.compile, args.rollout, args.torch_threads) == chosen
    assert gpus.threads == [chosen[2]] * bool(chosen[2])


@pytest.mark.parametrize("name", FULL)
def test_checkpoints_keep_the_random_state_of_this_process_s_gpu_alone(name, monkeypatch):
    script, used = load_script(name), []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: used.append("all") or [torch.zeros(1)] * 8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: used.append(("get", device)) or torch.ones(1))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: used.append("set all"))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: used.append(("set", device)))
    assert script.plumbing.rng_state(torch.device("cpu"))["cuda"] is None  # a CPU run keeps no GPU state
    gpu = torch.device("cuda:3")
    state = script.plumbing.rng_state(gpu)
    script.plumbing.set_rng_state(state, torch.device("cuda:0"))  # resumed where that GPU is the first
    script.plumbing.set_rng_state(state, torch.device("cpu"))  # or on a machine with none
    assert used == [("get", gpu), ("set", torch.device("cuda:0"))]


@pytest.mark.parametrize("name", FULL)
def test_bf16_autocast_covers_the_encoders_alone(name, tmp_path, monkeypatch):
    """The heads run in fp32: bf16 logits and values would be rounded before they are cast back, and could round
    differently in a batch of the rollout's size and one of the update's. So the first minibatch of the first epoch,
    on the weights that made the rollout, has a log-ratio at fp32's rounding (a bf16 head's is near 1e-3); not
    exactly zero, since a CPU may block an fp32 product of another batch size differently."""
    script, logratios, wrapped = load_script(name), [], []
    loss, autocast = script.clipped_policy_loss, script.plumbing.autocast_bf16
    monkeypatch.setattr(script, "clipped_policy_loss", lambda lr, *a: logratios.append(lr.detach()) or loss(lr, *a))
    monkeypatch.setattr(script.plumbing, "autocast_bf16", lambda module: wrapped.append(module) or autocast(module))
    monkeypatch.chdir(tmp_path)
    flags = [*smoke_args(name), "--device", "cpu", "--autocast", "bf16", "--eval-interval", "0", "--e-auxiliary", "1"]
    run_name = script.train(parse(script, flags if "ppg" in name else [*flags[:-2], "--total-timesteps", "128"]))
    encoders = {"network", "value_network"}  # PPG's dual architecture has a second one
    assert wrapped and all(isinstance(m, torch.nn.Sequential) and len(m) > 2 for m in wrapped)
    agent = script.Agent((64, 64, 3), 15, 16, "orthogonal", *(["dual"] if "ppg" in name else []))
    assert len(wrapped) == len([n for n, _ in agent.named_children() if n in encoders])
    assert logratios[0].abs().max() < 1e-5, logratios[0].abs().max()
    assert read_scalars(tmp_path / "runs" / run_name)["losses/approx_kl"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_buffers_are_made_on_the_device_and_the_gpu_policy_is_set(name, tmp_path, monkeypatch):
    """The rollout storage (and PPG's phase buffer) is allocated where it lives, never built on the host and copied
    (6 GiB for PPG's buffer); TF32 and cuDNN's autotuner are set explicitly, off under --torch-deterministic."""
    made, zeros = [], torch.zeros

    def recording_zeros(*size, **kwargs):
        shape = size[0] if len(size) == 1 and isinstance(size[0], tuple) else size
        made.append((tuple(shape), kwargs.get("device")))
        return zeros(*size, **kwargs)

    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    narrow_lean(script, monkeypatch)
    Recorder(script, monkeypatch)
    monkeypatch.setattr(torch, "zeros", recording_zeros)
    with gpu_policy_kept():
        for deterministic in (True, False):
            made.clear()
            flag = "--torch-deterministic" if deterministic else "--no-torch-deterministic"
            small = [
                "--feature-dim",
                "16",
                *(["--e-auxiliary", "1"] if "ppg" in name else ["--total-timesteps", "128"]),
            ]
            # TF32 left as torch has it (convolutions on, matrix products off), as CleanRL leaves it: the test
            # flips both first, so that a script that set them either way would be caught
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = deterministic, not deterministic
            script.train(parse(script, [*smoke_args(name), *small, "--device", "cpu", "--eval-interval", "0", flag]))
            buffers = [device for shape, device in made if len(shape) >= 2 and shape[0] == 32]  # (num_steps, ...)
            assert len(buffers) >= 6 and all(device == torch.device("cpu") for device in buffers), made
            assert torch.backends.cudnn.deterministic is deterministic
            assert torch.backends.cudnn.benchmark is not deterministic
            assert torch.backends.cudnn.allow_tf32 is deterministic
            assert torch.backends.cuda.matmul.allow_tf32 is not deterministic


@contextlib.contextmanager
def gpu_policy_kept():
    """cuDNN's and TF32's flags put back as they were, by hand: monkeypatch cannot undo matmul's `allow_tf32`, which
    the module serves through `__getattr__` (pytest 9.2 deletes such an attribute on undo, and that fails)."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = [(cudnn, flag, getattr(cudnn, flag)) for flag in ("deterministic", "benchmark", "allow_tf32")]
    saved.append((matmul, "allow_tf32", matmul.allow_tf32))
    try:
        yield
    finally:
        for module, flag, value in saved:
            setattr(module, flag, value)


class Fragile:
    """An attribute that can be patched once and then neither put back nor deleted, whatever pytest's undo tries."""

    value = 1

    def __setattr__(self, name, value):
        if name in vars(self):
            raise AttributeError(f"{name} cannot be put back")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        raise AttributeError(f"{name} cannot be deleted")


def test_a_failing_undo_leaves_no_other_patch_behind():
    """The tests' `monkeypatch` (conftest) undoes every other change when one undo fails, then raises; pytest's own
    stops at the failure, and what it patched before stays patched for the rest of the session."""
    for patches, kept in ((MonkeyPatch(), 1), (pytest.MonkeyPatch(), 2)):
        namespace = types.SimpleNamespace(x=1)
        patches.setattr(namespace, "x", 2)
        patches.setattr(Fragile(), "value", 2)
        with pytest.raises(AttributeError, match="cannot be"):
            patches.undo()
        assert namespace.x == kept


@pytest.mark.parametrize("name", FULL)
def test_actions_are_drawn_without_multinomial_and_as_before(name, monkeypatch):
    """The full files draw actions without torch.multinomial (whose checks wait for the GPU), and draw the same
    actions as `Categorical.sample()`, seed for seed."""
    script = load_script(name)
    agent = script.Agent((64, 64, 3), 15, 32, "orthogonal", *(["dual"] if "ppg" in name else []))
    with torch.no_grad():
        agent.actor.bias.copy_(torch.linspace(-2, 2, 15))  # a policy far from uniform
    obs = torch.randint(0, 256, (64, 64, 64, 3), dtype=torch.uint8)
    with torch.no_grad():
        logits = agent.actor(agent.network(obs.permute(0, 3, 1, 2) / 255.0))
    multinomial, refused = torch.multinomial, lambda *a, **k: pytest.fail("torch.multinomial was called")
    for seed in range(5):
        monkeypatch.setattr(torch, "multinomial", refused)
        torch.manual_seed(seed)
        with torch.no_grad():
            drawn = agent.get_action_and_value(obs)[0]
        monkeypatch.setattr(torch, "multinomial", multinomial)
        torch.manual_seed(seed)
        assert torch.equal(drawn, torch.distributions.Categorical(logits=logits).sample())


def test_a_gpu_the_driver_lists_is_not_skipped_as_absent(monkeypatch):
    """conftest finds a GPU through nvidia-smi as well as through torch: a torch that cannot use it fails the CUDA
    runs instead of skipping them."""
    import conftest

    listing = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"
    monkeypatch.setattr(conftest.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    monkeypatch.setattr(conftest.subprocess, "run", lambda *a, **k: type("P", (), {"stdout": listing})())
    assert len(conftest.nvidia_gpus()) == 2
    monkeypatch.setattr(conftest.shutil, "which", lambda name: None)
    assert conftest.nvidia_gpus() == []
