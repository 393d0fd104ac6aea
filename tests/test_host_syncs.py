"""The update loops wait on nothing from the host: no index array copied to the device per minibatch, no tensor read
back per minibatch. On the CPU, a dispatch mode sees both as the operators a GPU would wait on: `lift_fresh` of an
integer array (numpy indices turned into a tensor) and `_local_scalar_dense` of any tensor (a validity check, a loss
or a KL read back by `.item()` or `float()`), outside the optimizer's step, which reads its step counters on the host
by design (they live there). On a GPU, `torch.cuda.set_sync_debug_mode` reports every operation that makes the host
wait on the device."""

import warnings

import pytest
import torch
import tyro
from conftest import DEVICES, load_script, narrow_lean, on_device, smoke_args
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

SCRIPTS = ["ppo_procgen", "ppg_procgen", "ppo_procgen_full", "ppg_procgen_full"]


class HostTraffic(TorchDispatchMode):
    """Counts the operators through which the host feeds an index or reads a value back, but in an optimizer step."""

    def __init__(self):
        super().__init__()
        self.count, self.in_step, self.hooks = 0, False, []

    def __enter__(self):
        for register, inside in ((register_optimizer_step_pre_hook, True), (register_optimizer_step_post_hook, False)):
            self.hooks.append(register(lambda *a, inside=inside: setattr(self, "in_step", inside)))
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if (
            first is not None
            and not self.in_step
            and (
                (func is torch.ops.aten.lift_fresh.default and not first.is_floating_point())
                or func is torch.ops.aten._local_scalar_dense.default
            )
        ):
            self.count += 1
        return func(*args, **(kwargs or {}))


class DeviceSyncs:
    """Counts the operations that make the host wait on the GPU, as `torch.cuda.set_sync_debug_mode` warns of them."""

    def __enter__(self):
        self.catcher = warnings.catch_warnings(record=True)
        self.records = self.catcher.__enter__()
        warnings.simplefilter("always")  # every sync, not the first of each place
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        self.catcher.__exit__(*exc)

    @property
    def count(self):
        return sum("synchronizing CUDA operation" in str(record.message) for record in self.records)


def counted(fn, traffic, marks):
    """`fn`, noting the count of host traffic at each call."""

    def wrapper(*args):
        marks.append(traffic.count)
        return fn(*args)

    return wrapper


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", SCRIPTS)
def test_no_host_traffic_between_the_minibatches_of_an_epoch(name, device, tmp_path, monkeypatch):
    """Through `train()` at smoke size: a policy-phase minibatch calls `clipped_policy_loss` once (2 an epoch), an
    auxiliary one `policy_kl` once (4 an epoch); between two calls of one epoch the count must not grow."""
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    narrow_lean(script, monkeypatch)
    traffic, marks = HostTraffic() if device == "cpu" else DeviceSyncs(), {}
    for fn in ("clipped_policy_loss", "policy_kl"):
        if hasattr(script, fn):
            marks[fn] = []
            monkeypatch.setattr(script, fn, counted(getattr(script, fn), traffic, marks[fn]))
    with traffic:
        epochs = ["--e-auxiliary", "2"] if "ppg" in name else []  # PPG: two auxiliary epochs, one after the other
        script.train(tyro.cli(script.Args, args=[*smoke_args(name), *on_device(name, device), *epochs]))
    for fn, per_epoch in (("clipped_policy_loss", 2), ("policy_kl", 4)):
        if fn in marks:
            calls = marks[fn]
            assert len(calls) >= 2 * per_epoch, (fn, calls)
            steps = [b - a for i, (a, b) in enumerate(zip(calls, calls[1:], strict=False)) if (i + 1) % per_epoch]
            assert steps == [0] * len(steps), (fn, steps)


class CopiesBack(torch.overrides.TorchFunctionMode):
    """On the CPU: counts the tensors copied to the host (`.cpu()`), each a wait on a GPU."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.Tensor.cpu
        return func(*args, **(kwargs or {}))


# a rollout step's copies back to the host: the actions (plain); folded, the test envs' actions too
WAITS = {"plain": 1, "folded": 2}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rollout", WAITS)
def test_a_rollout_step_waits_on_the_gpu_only_for_its_copies_back(rollout, device, tmp_path, monkeypatch):
    """Counted between two training steps' episode logs inside one rollout (the envs' step, the pinned copies to the
    device, the next policy step): the copies of the observations, rewards and dones to the GPU never wait; on the
    CPU, the copies back are counted. One H100 (torch 2.11, 2026-11-28) saw 3 waits a folded step, the training
    actions copied back twice (once for the games' early start, once for the loop's step): now once."""
    script = load_script("ppo_procgen_full")
    monkeypatch.chdir(tmp_path)
    syncs, marks, log_episodes = DeviceSyncs() if device == "cuda" else CopiesBack(), [], script.log_episodes

    def counted(episodes, infos, global_step, tag):
        if tag == "":  # a training step's, not a test env's
            marks.append(syncs.count)
        return log_episodes(episodes, infos, global_step, tag)

    monkeypatch.setattr(script, "log_episodes", counted)
    with syncs:
        script.train(tyro.cli(script.Args, args=[*smoke_args("ppo_procgen_full"), "--device", device, "--compile",
                                                 "off", "--rollout", rollout]))  # fmt: skip
    per_step = [b - a for i, (a, b) in enumerate(zip(marks, marks[1:], strict=False)) if (i + 1) % 32]  # one rollout
    assert len(per_step) == 2 * 31 and max(per_step) <= WAITS[rollout], (rollout, per_step)
