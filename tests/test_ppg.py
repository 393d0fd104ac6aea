"""What PPG adds: the auxiliary phase, the architectures, the cloning KL, the run-long schedule."""

import math

import pytest
import torch
import tyro
from conftest import load_script, narrow_lean, read_scalars, smoke_args

ARCHS = ["dual", "shared", "detach"]


def make_agent(arch, **flags):
    ppg = load_script("ppg_procgen")
    argv = ["--arch", arch] + [x for key, value in flags.items() for x in (f"--{key.replace('_', '-')}", str(value))]
    args = tyro.cli(ppg.Args, args=argv)
    torch.manual_seed(0)
    return ppg, args, ppg.Agent((64, 64, 3), 15, args.feature_dim, args.init_fn, args.arch)


def random_obs(n):
    return torch.randint(0, 256, (n, 64, 64, 3), dtype=torch.uint8)


@pytest.mark.parametrize("arch", ARCHS)
def test_auxiliary_phase_changes_the_parameters(arch):
    ppg, args, agent = make_agent(arch, e_auxiliary=2, num_aux_rollouts=2, n_aux_grad_accum=2)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3, eps=1e-5)
    aux_obs = random_obs(8 * 4).view(8, 4, 64, 64, 3)  # 8 steps x 4 rollouts
    aux_returns = torch.randn(8, 4)
    before = {name: p.detach().clone() for name, p in agent.named_parameters()}
    stats = ppg.auxiliary_phase(agent, optimizer, aux_obs, aux_returns, args)
    assert all(math.isfinite(v) for v in stats.values()) and stats["aux_value_loss"] > 0
    changed = {name for name, p in agent.named_parameters() if not torch.equal(p, before[name])}
    # the encoder learns (aux value and cloning), and both value heads learn
    assert any(n.startswith("network.") for n in changed) and any(n.startswith("aux_critic") for n in changed)
    assert any(n.startswith("critic") for n in changed)
    assert arch != "dual" or any(n.startswith("value_network.") for n in changed)
    assert not set(before) - changed - {n for n in before if n.startswith("actor")}  # actor: maybe zero grad
    # 2 epochs x 2 minibatches, gradients accumulated over 2: exactly 2 optimizer steps
    assert {int(s["step"]) for s in optimizer.state.values()} == {2}


def value_loss_grads(arch):
    _, _, agent = make_agent(arch)
    _, new_value, _ = agent.get_pi_value_and_aux_value(random_obs(4))
    (new_value**2).mean().backward()
    return agent


@pytest.mark.parametrize("arch", ARCHS)
def test_what_the_true_value_loss_trains(arch):
    agent = value_loss_grads(arch)
    encoder_grad = sum(p.grad.abs().sum() for p in agent.network.parameters() if p.grad is not None)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in agent.critic.parameters())
    if arch == "shared":
        assert encoder_grad > 0
    else:  # detach: the value head reads detached features; dual: it has a network of its own
        assert encoder_grad == 0
    if arch == "dual":
        assert all(p.grad.abs().sum() > 0 for p in agent.value_network.parameters())


def test_dual_networks_share_no_parameters():
    _, _, agent = make_agent("dual")
    policy = {id(p) for p in agent.network.parameters()}
    value = {id(p) for p in agent.value_network.parameters()}
    assert policy and value and not policy & value


def test_kl_term():
    ppg = load_script("ppg_procgen")
    logits = torch.randn(5, 15)
    assert ppg.policy_kl(logits, logits.clone()).abs() < 1e-6
    old = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    new = torch.log(torch.tensor([[0.25, 0.75], [0.9, 0.1]]))
    # row 0: 0.5 ln(0.5 / 0.25) + 0.5 ln(0.5 / 0.75) = 0.5 ln(4 / 3); row 1: 0
    torch.testing.assert_close(ppg.policy_kl(old, new), torch.tensor(0.25 * math.log(4 / 3)))


def test_learning_rate_anneals_over_the_run_not_per_phase(tmp_path, monkeypatch):
    ppg = load_script("ppg_procgen")
    monkeypatch.chdir(tmp_path)
    narrow_lean(ppg, monkeypatch)
    flags = [*smoke_args("ppg_procgen"), "--total-timesteps", "512", "--anneal-lr", "--eval-interval", "0",
             "--device", "cpu"]  # fmt: skip
    run_name = ppg.train(tyro.cli(ppg.Args, args=flags))
    scalars = read_scalars(tmp_path / "runs" / run_name)
    # 4 iterations in 2 phases of 2: one straight line from 5e-4, not restarted at the second phase
    lrs = [value for _, value in scalars["charts/learning_rate"]]
    assert lrs == pytest.approx([5e-4, 3.75e-4, 2.5e-4, 1.25e-4])
    assert len(scalars["losses/aux/kl_loss"]) == 2


@pytest.mark.parametrize("arch", ["dual", "detach"])
def test_an_epoch_without_the_policy_loss_leaves_the_policy_bitwise_unchanged(tmp_path, monkeypatch, arch):
    ppg = load_script("ppg_procgen")
    monkeypatch.chdir(tmp_path)
    narrow_lean(ppg, monkeypatch)
    moved, adam_step = [], torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):  # which parameters each optimizer step changed
        params = self.param_groups[0]["params"]
        before = [p.detach().clone() for p in params]
        result = adam_step(self, *args, **kwargs)
        moved.append([not torch.equal(b, p) for b, p in zip(before, params, strict=True)])
        return result

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    flags = [*smoke_args("ppg_procgen"), "--arch", arch, "--e-policy", "1", "--v-value", "2", "--eval-interval", "0",
             "--device", "cpu"]  # fmt: skip
    args = tyro.cli(ppg.Args, args=flags)
    ppg.train(args)
    names = [
        name for name, _ in ppg.Agent((64, 64, 3), 15, args.feature_dim, args.init_fn, args.arch).named_parameters()
    ]  # the optimizer's order
    # per iteration 2 epochs x 2 minibatches: steps 0-1 train both losses, steps 2-3 only the value loss
    for i in range(2 * 4):
        changed = {name for name, m in zip(names, moved[i], strict=True) if m}
        policy_only = {n for n in changed if n.startswith(("network.", "actor."))}
        assert any(n.startswith("critic.") for n in changed), (i, changed)  # the value head learns in every step
        assert bool(policy_only) == (i % 4 < 2), (i, sorted(policy_only))
        assert not any(n.startswith("aux_critic.") for n in changed)  # the auxiliary phase alone trains it


def test_a_separate_auxiliary_optimizer_takes_the_auxiliary_steps_and_anneals_alike(tmp_path, monkeypatch):
    """`--aux-optimizer separate` (full file): the auxiliary phase steps an Adam of its own, the same one in every
    phase, and `--anneal-lr` lowers its learning rate with the policy phase's."""
    full = load_script("ppg_procgen_full")
    monkeypatch.chdir(tmp_path)
    seen, adam_step = [], torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):  # which Adam stepped, at which learning rate
        seen.append((id(self), self.param_groups[0]["lr"]))
        return adam_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    flags = [*smoke_args("ppg_procgen_full"), "--total-timesteps", "512", "--anneal-lr", "--eval-interval", "0",
             "--device", "cpu", "--aux-optimizer", "separate", "--e-auxiliary", "2"]  # fmt: skip
    full.train(tyro.cli(full.Args, args=flags))
    # each phase: 2 iterations x 2 policy minibatches, then 2 auxiliary epochs x 4 minibatches
    policy, aux = seen[0][0], seen[4][0]
    assert policy != aux and [adam for adam, _ in seen] == ([policy] * 4 + [aux] * 8) * 2
    lrs = [5e-4] * 2 + [3.75e-4] * 2 + [3.75e-4] * 8 + [2.5e-4] * 2 + [1.25e-4] * 2 + [1.25e-4] * 8
    assert [lr for _, lr in seen] == pytest.approx(lrs)
