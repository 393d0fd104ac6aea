"""V-trace advantages and prioritised segment sampling, against GAE and values worked out by hand."""

import numpy as np
import pytest
import torch
from conftest import load_script, parse

SCRIPTS = ["ppo_procgen_full", "ppg_procgen_full"]


@pytest.fixture(params=SCRIPTS)
def script(request):
    return load_script(request.param)


def random_rollout(seed, num_steps=16, num_envs=3):
    g = torch.Generator().manual_seed(seed)
    rewards, values = torch.randn(num_steps, num_envs, generator=g), torch.randn(num_steps, num_envs, generator=g)
    dones = (torch.rand(num_steps, num_envs, generator=g) < 0.2).float()
    return rewards, values, dones, torch.randn(num_envs, generator=g), torch.tensor([0.0, 1.0, 0.0])


@pytest.mark.parametrize("clips", [(1.0, 1.0), (2.0, 1.5)])
def test_vtrace_with_ratio_one_is_gae_exactly(script, clips):
    rollout = random_rollout(0)
    assert rollout[2].sum() > 0  # terminals inside the trajectory
    gae = script.compute_gae(*rollout, 0.99, 0.95)
    vtrace = script.compute_gae(*rollout, 0.99, 0.95, torch.ones(16, 3), *clips)
    assert torch.equal(gae[0], vtrace[0]) and torch.equal(gae[1], vtrace[1])


@pytest.mark.parametrize("rho_clip,expected", [(1.0, [0.75, 2.0]), (1.5, [0.875, 3.0])])
def test_vtrace_by_hand_with_ratios_above_the_clip(script, rho_clip, expected):
    # gamma = lambda = 0.5, rewards (1, 2), values (0.5, 1), bootstrap 2, ratios (0.5, 2), c clipped at 1:
    # t=1: rho = min(rho_clip, 2); delta = rho (2 + 0.5 * 2 - 1) = 2 rho; A1 = delta
    # t=0: rho = c = 0.5; delta = 0.5 (1 + 0.5 * 1 - 0.5) = 0.5; A0 = 0.5 + 0.5 * 0.5 * 0.5 * A1
    rewards, values = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.5], [1.0]])
    dones, next_value, next_done = torch.zeros(2, 1), torch.tensor([2.0]), torch.tensor([0.0])
    ratio = torch.tensor([[0.5], [2.0]])
    advantages, returns = script.compute_gae(
        rewards, values, dones, next_value, next_done, 0.5, 0.5, ratio, rho_clip, 1.0
    )
    torch.testing.assert_close(advantages, torch.tensor([[expected[0]], [expected[1]]]))
    torch.testing.assert_close(returns, advantages + values)


def test_minibatches_without_priorities_cover_each_sample_once_per_epoch(script):
    """`--prio-alpha 0`, the default: `minibatches` (what `train` calls) shuffles the whole batch, weight None."""
    args = parse(script, ["--num-envs", "4", "--num-steps", "8", "--num-minibatches", "4", "--device", "cpu"])
    script.check_args(args)
    for _ in range(5):
        batches = script.minibatches(torch.randn(8, 4), args, beta=0.4)
        assert [len(mb_inds) for mb_inds, _ in batches] == [8] * 4 and all(w is None for _, w in batches)
        assert sorted(np.concatenate([mb_inds for mb_inds, _ in batches])) == list(range(32))


def test_sampler_frequencies_and_weights_follow_the_priorities(script):
    """Metta's draws: P = (p^alpha + 1e-6) / (sum p^alpha + 1e-6), no segment twice in a minibatch (drawn without
    replacement, so a minibatch's first segment alone is drawn from P itself), the weights (N P)^-beta."""
    np.random.seed(0)
    priorities, alpha, beta = np.array([0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0]), 0.6, 0.4
    probs = (priorities**alpha + 1e-6) / ((priorities**alpha).sum() + 1e-6)
    counts = np.zeros(8)
    for _ in range(5000):  # 5000 x 2 minibatches: 10,000 first draws
        segments, weights = script.prioritized_segments(priorities, 2, alpha, beta)
        np.testing.assert_allclose(weights, (8 * probs[segments]) ** -beta, rtol=1e-6)
        assert all(len(set(row)) == len(row) for row in segments.tolist())
        np.add.at(counts, segments[:, 0], 1)
    expected = probs / probs.sum() * counts.sum()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 7 degrees of freedom: 24.3 is the 0.999 quantile, so a correct sampler fails 1 seed in 1000 (this seed passes)
    assert chi2 < 24.32, (counts, expected)


def test_importance_weights_weight_the_losses(script):
    logratio, advantages = torch.zeros(4), torch.tensor([1.0, 2.0, 3.0, 4.0])
    loss = script.clipped_policy_loss(logratio, advantages, 0.2)
    torch.testing.assert_close(script.weighted_mean(loss, torch.ones(4)), loss.mean())
    # sum(w x) / n with w = (2, 0, 0, 2): -(2 * 1 + 2 * 4) / 4
    weights = torch.tensor([2.0, 0.0, 0.0, 2.0])
    torch.testing.assert_close(script.weighted_mean(loss, weights), torch.tensor(-2.5))
    value = script.weighted_mean(
        script.clipped_value_loss(torch.ones(4), torch.ones(4), torch.tensor([0.0, 1, 1, 3]), None), weights
    )
    torch.testing.assert_close(value, torch.tensor(0.5 * (2 * 1 + 2 * 4) / 4))
