"""The training loop, through `train()`, with scripted games in place of procgen (`scripted_env.py`): the stored batch
lines up with the transitions it came from, the update uses the returns a hand computation gives, every loss term
has its sign and its weight, a small task is learned, and the held-out protocol reaches the games' arguments."""

import copy

import numpy as np
import pytest
import torch
from conftest import load_script, narrow_lean, parse, read_scalars
from scripted_env import Bandit, Recorder, ids

pytestmark = pytest.mark.xdist_group(__name__)  # one worker: its module fixtures train once
SCRIPTS = ["ppo_procgen", "ppg_procgen", "ppo_procgen_full", "ppg_procgen_full"]
NUM_ENVS, NUM_STEPS = 4, 8
# 2 iterations of 4 envs x 8 steps, 2 minibatches; raw rewards, so that the stored ones can be compared with the script
SMALL = ["--num-envs", str(NUM_ENVS), "--num-steps", str(NUM_STEPS), "--num-minibatches", "2", "--total-timesteps",
         "64", "--num-eval-envs", "2", "--no-norm-reward", "--feature-dim", "16", "--device", "cpu"]  # fmt: skip
PPG = ["--n-iteration", "2", "--num-aux-rollouts", "2", "--e-auxiliary", "1"]  # one phase of 2 iterations


def is_ppg(name):
    return name.startswith("ppg")


def train(name, monkeypatch, tmp_path, flags=(), game=None, patch=None, init=None, stacks=(2,)):
    """Run `train()` of a script on scripted games, its network `stacks` of channels (conftest's narrow one by
    default); returns the Recorder and the logged scalars."""
    script = load_script(name)
    tmp_path.mkdir(exist_ok=True)  # a run of its own, where a test compares two
    monkeypatch.chdir(tmp_path)
    recorder = Recorder(script, monkeypatch, game, init)
    narrow_lean(script, monkeypatch, stacks)
    if patch:
        patch(script)
    flags = [*SMALL, *(PPG if is_ppg(name) else []), *flags, "--exp-name", "loop"]
    flags += ["--cnn-channels", *map(str, stacks)] if name.endswith("_full") else []
    run_name = script.train(parse(script, flags))
    return recorder, read_scalars(tmp_path / "runs" / run_name)


@pytest.fixture(scope="module", params=SCRIPTS)
def default_run(request, tmp_path_factory):
    """One run per script at the default flags (but the sizes), shared by the alignment tests."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return request.param, *train(request.param, monkeypatch, tmp_path_factory.mktemp(request.param))


def training_acts(recorder):
    """The rollout's calls of the agent on the training envs (instance 0, not the test envs): (obs, its outputs)."""
    return [(x, out) for kind, x, out in recorder.calls if kind == "act" and ids(x)[0][0] == 0]


def rollouts(recorder):
    """Per iteration: the (env, step) ids of the observations acted on, (num_steps, num_envs) each, and what the
    agent returned on them (action, logprob, entropy, value)."""
    acts = training_acts(recorder)
    out = []
    for start in range(0, len(acts), NUM_STEPS):
        chunk = acts[start : start + NUM_STEPS]
        env_ids = torch.stack([ids(x)[1] for x, _ in chunk])
        steps = torch.stack([ids(x)[2] for x, _ in chunk])
        results = [torch.stack([o[k].flatten() for _, o in chunk]) for k in range(4)]
        out.append((env_ids, steps, results))
    return out


def hand_gae(rewards, values, dones, next_value, next_done, gamma, lam, ratio=None, rho_clip=1.0, c_clip=1.0):
    """GAE written out for one env at a time: delta_t = r_t + gamma V_{t+1} (1 - d_{t+1}) - V_t, and A_t = delta_t +
    gamma lam (1 - d_{t+1}) A_{t+1}. With `ratio`, V-trace as Espeholt et al. define it, with a lambda: delta_t is
    weighted by min(rho_clip, r_t) and A_{t+1} by min(c_clip, r_t) (without it, both weights are 1: GAE)."""
    rewards, values, dones = (np.asarray(a, dtype=np.float64) for a in (rewards, values, dones))
    ratio = np.ones_like(rewards) if ratio is None else np.asarray(ratio, dtype=np.float64)
    next_value, next_done = np.asarray(next_value, dtype=np.float64).ravel(), np.asarray(next_done, dtype=np.float64)
    advantages = np.zeros_like(rewards)
    for i in range(rewards.shape[1]):
        running = 0.0
        for t in reversed(range(rewards.shape[0])):
            last = t == len(rewards) - 1
            later_value = next_value[i] if last else values[t + 1, i]
            later_done = next_done[i] if last else dones[t + 1, i]
            delta = min(rho_clip, ratio[t, i]) * (rewards[t, i] + gamma * later_value * (1 - later_done) - values[t, i])
            running = delta + gamma * lam * min(c_clip, ratio[t, i]) * (1 - later_done) * running
            advantages[t, i] = running
    return advantages, advantages + values


def test_the_stored_batch_lines_up_with_its_transitions(default_run):
    name, recorder, _ = default_run
    env, iterations = recorder.train_env, rollouts(recorder)
    gaes, bootstraps = recorder.of("compute_gae"), [x for kind, x, _ in recorder.calls if kind == "value"]
    assert len(iterations) == len(gaes) == len(bootstraps) == 2
    previous_last = None
    for (env_ids, steps, (actions, _, _, values)), (inputs, _), next_x in zip(
        iterations, gaes, bootstraps, strict=True
    ):
        rewards, stored_values, dones, next_value, next_done = inputs[:5]
        assert (env_ids == torch.arange(NUM_ENVS)).all()
        # consecutive steps of each env, none lost between iterations
        assert (steps == steps[0] + torch.arange(NUM_STEPS).view(-1, 1)).all()
        assert previous_last is None or (steps[0] == previous_last + 1).all()
        previous_last = steps[-1]
        for t in range(NUM_STEPS):
            for i in range(NUM_ENVS):
                c = int(steps[t, i])
                assert env.acted[(i, c)] == int(actions[t, i])  # the action chosen on obs[t] is the one played on it
                assert float(rewards[t, i]) == env.script.reward(0, i, c, None)  # the reward of that transition
                assert float(dones[t, i]) == float((i, c) in env.starts)  # obs[t] starts an episode
        torch.testing.assert_close(stored_values, values)
        # the bootstrap is the value of the observation after the last step, with its episode start
        assert (ids(next_x)[0] == 0).all() and (ids(next_x)[2] == steps[-1] + 1).all()
        bootstrap = [out for kind, x, out in recorder.calls if kind == "value" and x is next_x][0]
        torch.testing.assert_close(next_value.flatten(), bootstrap.flatten())
        expected = [float((i, int(steps[-1, i]) + 1) in env.starts) for i in range(NUM_ENVS)]
        assert next_done.tolist() == expected
    assert any(env.starts)  # episodes did end inside the batch: the flags were tested where they matter


def test_the_update_uses_the_hand_computed_returns_and_advantages(default_run):
    name, recorder, _ = default_run
    args = load_script(name).Args()
    expected = {}  # (env, step) -> (return, normalised advantage, value, action, logprob) of the rollout
    for (_, steps, (actions, logprobs, _, values)), (inputs, _) in zip(
        rollouts(recorder), recorder.of("compute_gae"), strict=True
    ):
        advantages, returns = hand_gae(*inputs[:5], args.gamma, args.gae_lambda)
        normalised = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)
        for t in range(NUM_STEPS):
            for i in range(NUM_ENVS):
                key = (i, int(steps[t, i]))
                expected[key] = (returns[t, i], normalised[t, i], values[t, i], actions[t, i], logprobs[t, i])
    updates = [(x, out) for kind, x, out in recorder.calls if kind == "update"]
    value_losses, policy_losses = recorder.of("clipped_value_loss"), recorder.of("clipped_policy_loss")
    epochs = args.update_epochs if hasattr(args, "update_epochs") else max(args.e_policy, args.v_value)
    assert (
        len(updates) == len(value_losses) == len(policy_losses) == 2 * epochs * 2
    )  # iterations x epochs x minibatches
    seen = {}
    for (x, (_, newlogprob, _, _)), (v_in, _), (p_in, _) in zip(updates, value_losses, policy_losses, strict=True):
        _, env_ids, steps = ids(x)
        rows = [expected[(int(i), int(c))] for i, c in zip(env_ids, steps, strict=True)]
        want = torch.tensor([[float(v) for v in row[:3]] for row in rows])
        torch.testing.assert_close(v_in[2].double(), want[:, 0].double(), rtol=1e-5, atol=1e-5)  # returns
        torch.testing.assert_close(p_in[1].double(), want[:, 1].double(), rtol=1e-4, atol=1e-4)  # advantages
        torch.testing.assert_close(v_in[1], want[:, 2].float())  # the old values, for value clipping
        # the old log-probabilities: logratio = new - old
        old = torch.stack([row[4] for row in rows])
        torch.testing.assert_close(newlogprob - p_in[0], old, rtol=1e-5, atol=1e-5)
        for i, c in zip(env_ids, steps, strict=True):
            seen[(int(i), int(c))] = seen.get((int(i), int(c)), 0) + 1
    assert seen == dict.fromkeys(expected, epochs)  # every sample once per epoch


@pytest.mark.parametrize("name", SCRIPTS)
def test_held_out_protocol_reaches_the_games(name, tmp_path, monkeypatch):
    recorder, _ = train(name, monkeypatch, tmp_path, ["--num-levels", "50", "--start-level", "7"])
    made = type(recorder.train_env).made
    train_env, test_env = made
    assert train_env.kwargs["num_levels"] == 50 and train_env.kwargs["start_level"] == 7
    assert test_env.kwargs["num_levels"] == 0  # the test envs draw from every level
    assert test_env.kwargs.get("start_level", 0) == 0
    assert train_env.rand_seed != test_env.rand_seed  # and their own stream of levels
    assert train_env.kwargs["env_name"] == test_env.kwargs["env_name"] == "starpilot"


def policy_after_update(recorder, name):
    """The agent's weights after the policy update: PPO's at the end, PPG's as its auxiliary phase found them."""
    if is_ppg(name):
        return [x for kind, x, _ in recorder.calls if kind == "before_aux"][0]
    return recorder.agents[0]


def rollout_obs(recorder):
    return torch.cat([x for x, _ in training_acts(recorder)])


def logprob_change(recorder, before, after):
    """Per rollout sample: log pi_after(a_t | o_t) - log pi_before(a_t | o_t), for the action the rollout took."""
    actions = torch.cat([out[0] for _, out in training_acts(recorder)])
    with torch.no_grad():
        old, new = (agent.get_action_and_value(rollout_obs(recorder), actions)[1] for agent in (before, after))
    return new - old


def one_update(name, monkeypatch, tmp_path, flags=(), game=None, patch=None, init=None):
    """One iteration (PPG: one phase of one iteration), then the policies before and after its policy update."""
    size = ["--total-timesteps", str(NUM_ENVS * NUM_STEPS), *(["--n-iteration", "1"] if is_ppg(name) else [])]
    recorder, scalars = train(name, monkeypatch, tmp_path, [*size, *flags], game, patch, init)
    before = copy.deepcopy(recorder.agents[0])
    before.load_state_dict(recorder.agents[0].initial)
    return recorder, before, policy_after_update(recorder, name), scalars


def epochs_flag(name, n):
    return ["--e-policy", str(n), "--v-value", str(n)] if is_ppg(name) else ["--update-epochs", str(n)]


def zero_advantages(monkeypatch):
    """GAE replaced by zero advantages and returns equal to the values: only the entropy term pulls the policy."""
    zero = lambda rewards, values, *args, **kwargs: (torch.zeros_like(rewards), values.clone())  # noqa: E731
    return lambda script: monkeypatch.setattr(script, "compute_gae", zero)


def skewed_policy(agent):
    """A policy far from uniform (the initial one is nearly uniform, its entropy already at the top)."""
    with torch.no_grad():
        agent.actor.bias.copy_(torch.linspace(0, 3, agent.actor.bias.numel()))


@pytest.mark.parametrize("name", SCRIPTS)
def test_entropy_bonus_raises_entropy_and_its_weight_acts(name, tmp_path, monkeypatch):
    flags = [*epochs_flag(name, 2), "--max-grad-norm", "1e6", "--learning-rate", "1e-3"]
    entropies = {}
    for ent_coef in ("0", "0.5"):
        patch, flags_now = zero_advantages(monkeypatch), [*flags, "--ent-coef", ent_coef]
        recorder, before, after, _ = one_update(
            name, monkeypatch, tmp_path / ent_coef, flags_now, None, patch, skewed_policy
        )
        obs = rollout_obs(recorder)
        with torch.no_grad():
            entropies[ent_coef] = [agent.get_action_and_value(obs)[2].mean().item() for agent in (before, after)]
        moved = not all(
            torch.equal(p, q) for p, q in zip(before.actor.parameters(), after.actor.parameters(), strict=True)
        )
        assert moved == (ent_coef != "0")  # with no advantage, only the entropy weight moves the actor head
    assert entropies["0.5"][1] > entropies["0.5"][0] + 1e-4, entropies  # the bonus raises the entropy


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_step_uses_a_fresh_gradient(name, tmp_path, monkeypatch):
    """With only the entropy term acting, consecutive steps see gradients of the same size; gradients left from the
    step before (no zero_grad) would add up: twice the size at the second step, three times at the third."""
    norms, adam_step = [], torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):
        norms.append(torch.cat([p.grad.flatten() for p in self.param_groups[0]["params"] if p.grad is not None]).norm())
        return adam_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    flags = [*epochs_flag(name, 2), "--max-grad-norm", "1e6", "--ent-coef", "0.5", "--vf-coef", "0"]
    one_update(name, monkeypatch, tmp_path, flags, patch=zero_advantages(monkeypatch), init=skewed_policy)
    policy_steps = norms[:4]  # 2 epochs x 2 minibatches of the policy update
    assert len(policy_steps) == 4
    assert all(
        0.6 < float(later / earlier) < 1.5 for earlier, later in zip(policy_steps[:-1], policy_steps[1:], strict=True)
    ), norms


@pytest.mark.parametrize("name", SCRIPTS)
def test_value_moves_toward_the_returns_and_vf_coef_acts(name, tmp_path, monkeypatch):
    errors = {}
    for vf_coef in ("0", "0.5"):
        recorder, before, after, _ = one_update(name, monkeypatch, tmp_path / vf_coef, ["--vf-coef", vf_coef])
        returns = recorder.of("compute_gae")[0][1][1].flatten()
        obs = rollout_obs(recorder)
        with torch.no_grad():
            errors[vf_coef] = [((a.get_value(obs).flatten() - returns) ** 2).mean().item() for a in (before, after)]
        critic = [after.critic, *([after.value_network] if getattr(after, "arch", "") == "dual" else [])]
        initial = [before.critic, *([before.value_network] if getattr(before, "arch", "") == "dual" else [])]
        unchanged = all(torch.equal(p, q) for a, b in zip(critic, initial, strict=True)
                        for p, q in zip(a.parameters(), b.parameters(), strict=True))  # fmt: skip
        assert unchanged == (vf_coef == "0")  # what only the value loss reaches moves only with its weight
    assert errors["0.5"][1] < errors["0.5"][0], errors  # the value's squared error to the returns went down


def two_likely_actions(agent):
    """A policy that plays actions 0 and 1, the bandit's, about half of the time: rewards arrive from the start."""
    with torch.no_grad():
        agent.actor.bias.copy_(torch.tensor([2.0, 2.0] + [0.0] * (agent.actor.bias.numel() - 2)))


@pytest.mark.parametrize("name", SCRIPTS)
def test_policy_moves_toward_actions_with_positive_advantages(name, tmp_path, monkeypatch):
    """The surrogate's first-order change, the mean of A_t (log pi_new - log pi_old)(a_t | o_t) over the batch, is
    positive: the actions with positive (normalised) advantages became likelier. No entropy bonus, so that nothing
    else pulls the policy."""
    flags = ["--learning-rate", "1e-3", "--ent-coef", "0"]
    recorder, before, after, _ = one_update(name, monkeypatch, tmp_path, flags, Bandit(), init=two_likely_actions)
    advantages = recorder.of("compute_gae")[0][1][0].flatten()
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    assert advantages.abs().max() > 0.5  # the rewards made a difference between the actions
    assert (advantages * logprob_change(recorder, before, after)).mean() > 0


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_clip_range_bounds_the_policy_update(name, tmp_path, monkeypatch):
    changes = {}
    for clip in ("0.01", "10"):
        # the clipped surrogate alone moves the policy: the entropy bonus and the value loss through the shared trunk
        # are not clipped, and with the narrow network they moved it as much as the surrogate did
        alone = ["--ent-coef", "0", "--vf-coef", "0"]
        flags = [*epochs_flag(name, 8), "--learning-rate", "2e-3", "--clip-coef", clip, *alone]
        recorder, before, after, _ = one_update(
            name, monkeypatch, tmp_path / clip, flags, Bandit(), init=two_likely_actions
        )
        changes[clip] = logprob_change(recorder, before, after).abs().mean().item()
    assert changes["0.01"] < 0.5 * changes["10"], changes


BANDIT = ["--num-envs", "8", "--num-steps", "16", "--num-minibatches", "2", "--learning-rate", "3e-3",
          "--eval-interval", "0", "--feature-dim", "32"]  # fmt: skip
BANDIT_ITERATIONS = 8


@pytest.mark.parametrize(
    "name,flags",
    [("ppo_procgen", []), *(("ppg_procgen", ["--arch", arch]) for arch in ("dual", "shared", "detach"))],
)
def test_a_contextual_bandit_is_learned(name, flags, tmp_path, monkeypatch):
    """The observation shows which of two actions pays; the first policy plays either one about a quarter of the
    time, so it earns about 0.27. Within 8 iterations of 128 steps the agent must earn over 0.8 on average."""
    game, steps = Bandit(), str(BANDIT_ITERATIONS * 8 * 16)
    # two stacks of 8 channels learn it as the default network does (0.97 to 1.0 in the last iteration, at half the
    # time); one stack of 2 does not within the 8 iterations (0.5)
    _, scalars = train(name, monkeypatch, tmp_path, [*BANDIT, "--total-timesteps", steps, *flags], game,
                       init=two_likely_actions, stacks=(8, 8))  # fmt: skip
    returns = [r for _, r in scalars["charts/episodic_return"]]
    first, last = np.mean(returns[:128]), np.mean(returns[-128:])  # the first and the last iteration's episodes
    assert first < 0.5 and last > 0.8, (first, last)


PPG_SCRIPTS = [name for name in SCRIPTS if is_ppg(name)]


@pytest.mark.parametrize("name", PPG_SCRIPTS)
def test_phase_buffer_holds_each_phase_s_rollouts_with_their_own_returns(name, tmp_path, monkeypatch):
    recorder, _ = train(name, monkeypatch, tmp_path, ["--total-timesteps", str(4 * NUM_ENVS * NUM_STEPS)])  # 2 phases
    iterations, gaes, phases = rollouts(recorder), recorder.of("compute_gae"), recorder.of("auxiliary_phase")
    assert len(iterations) == 4 and len(phases) == 2
    for phase, (inputs, _) in enumerate(phases):
        aux_obs, aux_returns = inputs[2], inputs[3]
        _, buffer_envs, buffer_steps = ids(aux_obs)
        for slot in range(2):  # the slots of this phase hold its own two iterations, not the phase before's
            env_ids, steps, _ = iterations[2 * phase + slot]
            columns = slice(slot * NUM_ENVS, (slot + 1) * NUM_ENVS)
            assert torch.equal(buffer_envs[:, columns], env_ids) and torch.equal(buffer_steps[:, columns], steps)
            torch.testing.assert_close(aux_returns[:, columns], gaes[2 * phase + slot][1][1])  # the GAE returns


class StubAgent(torch.nn.Module):
    """An agent read off the observations' ids, for the auxiliary phase alone. Both value heads answer the return
    stored for each observation, so the two value losses are zero exactly when every target goes with its own
    observation. `get_pi` (the old policy) gives base logits; the current policy adds `shift` and the weights `w`."""

    def __init__(self, targets, shift):
        super().__init__()
        self.targets, self.shift = targets, shift
        self.w = torch.nn.Parameter(torch.zeros(15))

    def base(self, x):
        _, env_ids, steps = ids(x)
        return 4.0 * torch.nn.functional.one_hot((3 * env_ids + steps) % 15, 15).float()

    def get_pi(self, x):
        return self.base(x)

    def get_pi_value_and_aux_value(self, x):
        _, env_ids, steps = ids(x)
        target = torch.tensor([self.targets[(int(i), int(c))] for i, c in zip(env_ids, steps, strict=True)])
        target = target.view(-1, 1) + 0 * self.w.sum()
        logits = self.base(x) + self.shift + self.w
        return torch.distributions.Categorical(logits=logits), target, target


def stub_phase(name, beta_clone, monkeypatch):
    """The auxiliary phase of a script over a buffer of 4 steps x 8 rollouts from scripted games, with a StubAgent."""
    script = load_script(name)
    Recorder(script, monkeypatch)
    args = parse(script, [*SMALL, *PPG, "--beta-clone", str(beta_clone), "--e-auxiliary", "2"])
    args.world_size = getattr(args, "world_size", 1)
    games = script.Procgen(8, 0)  # the scripted games that Recorder put in place
    rows = []
    for _ in range(4):
        rows.append(games.observe()[1]["rgb"])
        games.act(np.zeros(8, dtype=np.int32))
    aux_obs = torch.as_tensor(np.stack(rows))  # (steps, rollouts, 64, 64, 3)
    _, env_ids, steps = ids(aux_obs)
    aux_returns = (steps * 10 + env_ids).float()  # a distinct return for every observation
    targets = {(int(i), int(c)): float(r) for i, c, r in zip(env_ids.flatten(), steps.flatten(), aux_returns.flatten(),
                                                             strict=True)}  # fmt: skip
    shift = torch.linspace(-1.0, 2.0, 15)
    agent = StubAgent(targets, shift)
    stats = script.auxiliary_phase(agent, torch.optim.Adam(agent.parameters(), lr=0.1), aux_obs, aux_returns, args)
    return stats, agent, aux_obs, shift


@pytest.mark.parametrize("name", PPG_SCRIPTS)
def test_auxiliary_targets_go_with_their_observations_and_the_kl_runs_from_the_old_policy(name, monkeypatch):
    stats, _, aux_obs, shift = stub_phase(name, 0.0, monkeypatch)
    assert stats["aux_value_loss"] == 0 and stats["real_value_loss"] == 0  # every return met its own observation
    # beta_clone 0 leaves w at 0: the KL is the same at every step, KL(old || new) with new = old + shift
    old = torch.distributions.Categorical(logits=StubAgent({}, shift).base(aux_obs.flatten(0, 1)))
    new = torch.distributions.Categorical(logits=old.logits + shift)
    forward = torch.distributions.kl_divergence(old, new).mean().item()
    backward = torch.distributions.kl_divergence(new, old).mean().item()
    assert abs(forward - backward) > 0.1 * forward  # the two directions differ here, so the test tells them apart
    assert stats["kl_loss"] == pytest.approx(forward, rel=1e-5)


@pytest.mark.parametrize("name", PPG_SCRIPTS)
def test_the_cloning_weight_acts(name, monkeypatch):
    _, unweighted, _, _ = stub_phase(name, 0.0, monkeypatch)
    stats, weighted, _, _ = stub_phase(name, 1.0, monkeypatch)
    assert not unweighted.w.any()  # nothing but the KL reaches the policy's w
    assert weighted.w.abs().sum() > 0.1 and stats["kl_loss"] > 0  # the KL pulls the policy back toward the old one


def test_the_evaluation_flags_change_no_training_number(default_run, tmp_path, monkeypatch):
    """The test envs draw their actions from a generator of their own, seeded anew at each evaluation: a run that
    evaluates every iteration (the default run), one that never does and one that evaluates more envs less often log
    the same losses."""
    name, _, scalars = default_run
    logged = [scalars]
    for k, flags in enumerate((["--eval-interval", "0"], ["--eval-interval", "2", "--num-eval-envs", "3"])):
        logged.append(train(name, monkeypatch, tmp_path / str(k), flags)[1])
    logged = [{tag: values for tag, values in run.items() if tag.startswith("losses/")} for run in logged]
    assert logged[0] and logged[0] == logged[1] == logged[2]
