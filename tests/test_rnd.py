"""RND: the intrinsic reward reaches the update, before GAE; the predictor learns; pretrained weights load."""

import pytest
import torch
import tyro
from conftest import DEVICES, load_script, on_device, smoke_args

SCRIPTS = ["ppo_procgen_full", "ppg_procgen_full"]


def test_predictor_loss_falls_on_repeated_observations():
    script = load_script("ppo_procgen_full")
    torch.manual_seed(0)
    rnd = script.RND(num_envs=4, gamma=0.99)
    obs = torch.randint(0, 256, (8, 4, 64, 64, 3), dtype=torch.uint8)
    rnd.intrinsic_reward(obs, obs, chunk=16)  # observation statistics from these observations
    optimizer = torch.optim.Adam(rnd.predictor.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        loss = rnd.prediction_error(obs.flatten(0, 1)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses
    assert all(not p.requires_grad for p in rnd.target.parameters())  # the target stays fixed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", SCRIPTS)
def test_intrinsic_reward_enters_before_gae_in_pretraining(tmp_path, monkeypatch, name, device):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    step = script.ProcgenVecEnv.step

    def no_extrinsic_reward(self, actions):
        obs, reward, terminated, truncated, info = step(self, actions)
        return obs, reward * 0.0, terminated, truncated, info

    seen = []
    gae, intrinsic_reward = script.compute_gae, script.RND.intrinsic_reward

    def record_gae(rewards, values, dones, next_value, next_done, *rest):
        advantages, returns = gae(rewards, values, dones, next_value, next_done, *rest)
        zero_reward = gae(torch.zeros_like(rewards), values, dones, next_value, next_done, *rest)[0]
        seen.append({"rewards": rewards.clone(), "advantages": advantages, "zero_reward": zero_reward})
        return advantages, returns

    def record_intrinsic(self, *a):
        out = intrinsic_reward(self, *a)
        seen.append({"intrinsic": out.clone()})
        return out

    monkeypatch.setattr(script.ProcgenVecEnv, "step", no_extrinsic_reward)
    monkeypatch.setattr(script, "compute_gae", record_gae)
    monkeypatch.setattr(script.RND, "intrinsic_reward", record_intrinsic)
    flags = [*smoke_args(name), *on_device(name, device), "--eval-interval", "0"]
    flags += ["--pretraining", "--intrinsic-coef", "0.5"]
    flags += ["--rnd-obs-norm-steps", "8"]
    script.train(tyro.cli(script.Args, args=flags))
    intrinsic, first = seen[0]["intrinsic"], seen[1]
    # GAE's rewards are exactly the intrinsic ones (times the coefficient): added before GAE, extrinsic dropped
    torch.testing.assert_close(first["rewards"], 0.5 * intrinsic, rtol=0, atol=0)
    assert first["rewards"].abs().sum() > 0
    effect = first["advantages"] - first["zero_reward"]
    assert effect.abs().sum() > 0  # the advantages move although every extrinsic reward is zero
    # added before GAE, a reward at step t also raises the advantages of earlier steps (gamma lambda
    # discounting); added after GAE it would change only its own step: effect == rewards
    assert not torch.allclose(effect, first["rewards"])
    torch.testing.assert_close(effect[-1], first["rewards"][-1])  # the last step has nothing after it


@pytest.mark.parametrize("name", SCRIPTS)
def test_init_model_loads_a_pretrained_model(tmp_path, monkeypatch, capsys, name):
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    base = [*smoke_args(name), "--device", "cpu", "--eval-interval", "0", "--save-model"]
    run = script.train(
        tyro.cli(
            script.Args,
            args=[*base, "--pretraining", "--intrinsic-coef", "1", "--rnd-obs-norm-steps", "8", "--exp-name", "pre"],
        )
    )
    pretrained_path = tmp_path / "runs" / run / "pre.cleanrl_model"  # named after --exp-name
    pretrained = torch.load(pretrained_path)
    assert any(k.startswith("rnd.") for k in pretrained)
    # fine-tuning without RND, with a learning rate so small that the weights stay where they were loaded
    flags = [*base, "--init-model-path", str(pretrained_path), "--lr", "1e-12", "--exp-name", "fine"]
    run = script.train(tyro.cli(script.Args, args=flags))
    tuned = torch.load(tmp_path / "runs" / run / "fine.cleanrl_model")
    assert not any(k.startswith("rnd.") for k in tuned)
    for key, value in tuned.items():
        torch.testing.assert_close(value, pretrained[key], rtol=0, atol=1e-6)
    with pytest.raises(SystemExit) as exc:  # weights of another network size
        script.train(tyro.cli(script.Args, args=[*base, "--feature-dim", "64", "--init-model", str(pretrained_path)]))
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "--init-model" in err[0] and "do not fit" in err[0], err


def test_a_resume_gives_each_process_its_own_running_intrinsic_returns(tmp_path, monkeypatch):
    """The model in a checkpoint is rank 0's, its running intrinsic return per env too; each process's own goes into
    its part of the checkpoint and comes back from there. Here a one-process checkpoint whose part says 7."""
    script = load_script("ppo_procgen_full")
    monkeypatch.chdir(tmp_path)
    flags = [*smoke_args("ppo_procgen_full"), "--device", "cpu", "--eval-interval", "0", "--intrinsic-coef", "0.5"]
    flags += ["--rnd-obs-norm-steps", "8"]
    run = script.train(tyro.cli(script.Args, args=[*flags, "--total-timesteps", "128", "--checkpoint-interval", "1"]))
    path = tmp_path / "runs" / run / "checkpoints" / "iter_00000001.pt"
    ckpt = torch.load(path, weights_only=False)
    assert torch.equal(ckpt["ranks"][0]["intrinsic_return"], ckpt["model"]["rnd.intrinsic_return"])
    ckpt["ranks"][0]["intrinsic_return"] = torch.full_like(ckpt["ranks"][0]["intrinsic_return"], 7.0)
    torch.save(ckpt, path)
    seen, reward = [], script.RND.intrinsic_reward
    monkeypatch.setattr(script.RND, "intrinsic_reward", lambda self, *a: seen.append(self.intrinsic_return.clone())
                        or reward(self, *a))  # fmt: skip
    script.train(tyro.cli(script.Args, args=[*flags, "--total-timesteps", "256", "--resume", str(path)]))
    assert len(seen) == 1 and torch.equal(seen[0], torch.full_like(seen[0], 7.0))


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_running_intrinsic_return_discounts_by_intrinsic_gamma_from_the_statistics_before_the_rollout(
    name, monkeypatch
):
    """The std that scales RND's reward is that of the running return R_t = gamma R_t-1 + e_t per env, gamma the
    `intrinsic_gamma` (here 0.5, with known errors e); the errors are computed with the observation statistics as they
    stood before the rollout (RND's and CleanRL's order), which the rollout's observations then update."""
    script = load_script(name)
    rnd = script.RND(num_envs=2, gamma=0.5)
    errors = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # (T, N)
    counts_seen = []

    def known_error(x):  # the errors by step, and the statistics' count when they are computed
        counts_seen.append(rnd.obs_count.item())
        return errors.flatten()[: len(x)]

    monkeypatch.setattr(rnd, "prediction_error", known_error)
    obs = torch.randint(0, 256, (3, 2, 64, 64, 3), dtype=torch.uint8)
    rewards = rnd.intrinsic_reward(obs, obs, chunk=6)
    assert counts_seen == [0.0] and rnd.obs_count.item() == 6  # computed first, merged after
    returns = torch.stack([errors[0], 0.5 * errors[0] + errors[1], 0.25 * errors[0] + 0.5 * errors[1] + errors[2]])
    torch.testing.assert_close(rnd.intrinsic_return, returns[-1])
    torch.testing.assert_close(rewards, errors / (returns.flatten().var(unbiased=False) + 1e-8).sqrt())
