"""The pure helpers of each script against values worked out by hand."""

import numpy as np
import pytest
import torch
from conftest import load_script

SCRIPTS = ["ppo_procgen", "ppg_procgen"]


@pytest.fixture(params=SCRIPTS)
def script(request):
    return load_script(request.param)


def test_gae_terminal_in_the_middle_and_bootstrap(script):
    # gamma = lambda = 0.5; env 0 ends an episode after step 1 (dones[2] = 1), env 1 after the last step
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0]])
    values = torch.tensor([[0.5, 0.0], [1.0, 0.0], [1.5, 0.0]])
    dones = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    next_value, next_done = torch.tensor([2.0, 4.0]), torch.tensor([0.0, 1.0])
    advantages, returns = script.compute_gae(rewards, values, dones, next_value, next_done, 0.5, 0.5)
    # env 0: A2 = 3 + 0.5*2 - 1.5 = 2.5 (bootstrapped); A1 = 2 - 1 = 1 (terminal); A0 = 1 + 0.5*1 - 0.5 + 0.25*1
    # env 1: A2 = 1 (terminal, no bootstrap); A1 = 0 + 0.25*1; A0 = 0 + 0.25*0.25
    expected = torch.tensor([[1.25, 0.0625], [1.0, 0.25], [2.5, 1.0]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_clipped_policy_loss(script):
    logratio = torch.log(torch.tensor([0.5, 1.0, 1.5, 1.5]))
    advantages = torch.tensor([1.0, 1.0, 1.0, -1.0])
    # per sample max(-A r, -A clip(r)): -0.5 (r below the clip, A > 0: unclipped), -1, -1.2 (clipped), 1.5
    loss = script.clipped_policy_loss(logratio, advantages, 0.2)
    torch.testing.assert_close(loss, torch.tensor([-0.5, -1.0, -1.2, 1.5]))
    # a clip range this wide is never active: the plain surrogate
    torch.testing.assert_close(script.clipped_policy_loss(logratio, advantages, 10.0).mean(), torch.tensor(-1.5 / 4))


def test_clipped_value_loss(script):
    newvalue, oldvalue, returns = torch.tensor([1.0, 3.0]), torch.tensor([0.0, 2.9]), torch.tensor([2.0, 2.0])
    # sample 0 moves by 1 > 0.5: its clipped value 0.5 has the larger error 2.25; sample 1 stays in range
    torch.testing.assert_close(script.clipped_value_loss(newvalue, oldvalue, returns, 0.5), torch.tensor([1.125, 0.5]))
    torch.testing.assert_close(script.clipped_value_loss(newvalue, oldvalue, returns, None), torch.tensor([0.5, 0.5]))


def test_minibatches_cover_the_batch_once(script):
    minibatches = script.minibatch_indices(64, 16, "cpu")
    assert [len(mb) for mb in minibatches] == [16] * 4
    assert sorted(np.concatenate(minibatches)) == list(range(64))


def test_every_finished_episode_is_logged(script):
    episodes = []
    infos = {
        "episode": {"r": np.array([3.0, 0.0, 5.0]), "l": np.array([10, 0, 20])},
        "_episode": np.array([1, 0, 1], bool),
    }
    script.log_episodes(episodes, infos, 7, "test_")
    script.log_episodes(episodes, {}, 8, "")  # a step where no episode ended
    assert episodes == [("test_", 7, 3.0, 10), ("test_", 7, 5.0, 20)]


@pytest.mark.parametrize("init_fn", ["orthogonal", "normed"])
def test_init_sets_the_norm_of_each_output_unit(script, init_fn):
    layer = script.layer_init(torch.nn.Conv2d(8, 4, 3), 0.7, init_fn)
    torch.testing.assert_close(layer.weight.flatten(1).norm(dim=1), torch.full((4,), 0.7))
    assert not layer.bias.any()


def agent_of(script, init_fn):
    args = [script.Args().feature_dim, init_fn, *(["dual"] if hasattr(script.Args, "arch") else [])]
    return script.Agent((64, 64, 3), 15, *args)


def test_default_trunks_keep_their_frameworks_init_under_orthogonal_heads(script):
    """torch_default (CleanRL): the trunk as PyTorch builds it, biases included; tf_default (baselines' PPO2):
    glorot-uniform weights, zero biases. Under both, the heads are orthogonal with gains 0.01 and 1."""
    torch.manual_seed(3)
    built = agent_of(script, "orthogonal").network[0]  # the first conv, before any init touched the generator
    torch.manual_seed(3)
    default = agent_of(script, "torch_default")
    first = default.network[0]
    torch.manual_seed(3)
    reference = torch.nn.Conv2d(3, 16, kernel_size=3, padding=1)  # what PyTorch alone draws first
    assert torch.equal(first.weight, reference.weight) and torch.equal(first.bias, reference.bias)
    assert not torch.equal(built.weight, reference.weight) and first.bias.any()
    glorot = agent_of(script, "tf_default")
    for layer in (m for m in glorot.network.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))):
        fan_in, fan_out = layer.weight[0].numel(), layer.weight.shape[0] * layer.weight[0, 0].numel()
        bound = np.sqrt(6 / (fan_in + fan_out))
        assert layer.weight.abs().max() <= bound
        assert layer.weight.std().item() == pytest.approx(bound / np.sqrt(3), rel=0.1)  # uniform on [-bound, bound]
        assert not layer.bias.any()
    for agent in (default, glorot):
        norms = [head.weight.norm(dim=1) for head in (agent.actor, agent.critic)]
        torch.testing.assert_close(norms[0], torch.full((15,), 0.01))
        torch.testing.assert_close(norms[1], torch.ones(1))
