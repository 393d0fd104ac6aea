"""The full files' features through `train()`, on scripted games (`scripted_env.py`): each test pins the key line of a
feature, so that a one-line mistake there fails it (`tests/mutate.py` lists those mistakes). V-trace's advantages
against a hand computation with ratios that are not 1, prioritised segments and their importance weights in the loss,
the RND predictor learning and pretraining without the game's reward, bf16 autocast in the encoders,
`--eval-only --eval-train-levels` on the training levels, and under torchrun each process's own levels and the
episodes of all of them in the log."""

import collections
import copy
import json
import time

import numpy as np
import pytest
import torch
from conftest import NARROW, ROOT, load_script, parse, read_scalars, smoke_args
from scripted_env import Recorder, ids
from test_distributed import torchrun
from test_loop import NUM_ENVS, NUM_STEPS, PPG, SMALL, epochs_flag, hand_gae, is_ppg, train

SCRIPTS = ["ppo_procgen_full", "ppg_procgen_full"]


def epochs(name, n):
    """n passes over each batch: PPO's update epochs, PPG's policy (and value) epochs."""
    return ["--e-policy", str(n)] if is_ppg(name) else ["--update-epochs", str(n)]


def by_sample(x, values):
    """{(env, step): value} for a minibatch's observations `x` and per-sample `values`."""
    _, env_ids, steps = ids(x)
    return {(int(i), int(c)): float(v) for i, c, v in zip(env_ids, steps, values, strict=True)}


def grid(rollout_steps, per_sample):
    """A (num_steps, num_envs) tensor of `per_sample` values, laid out as the rollout's steps of each env."""
    return torch.tensor([[per_sample[(i, int(rollout_steps[t, i]))] for i in range(NUM_ENVS)]
                         for t in range(NUM_STEPS)], dtype=torch.float64)  # fmt: skip


def training_obs(recorder):
    """The observations the rollouts acted on, (steps of every iteration, num_envs, 64, 64, 3): the training envs'
    (instance 0), not the test envs'."""
    return torch.stack([x for kind, x, _ in recorder.calls if kind == "act" and ids(x)[0][0] == 0])


def training_steps(recorder, iteration):
    """The (num_steps, num_envs) steps of the observations that iteration `iteration` (from 0) acted on."""
    return ids(training_obs(recorder)[iteration * NUM_STEPS : (iteration + 1) * NUM_STEPS])[2]


def normalised(x):
    return (x - x.mean()) / (x.std() + 1e-8)


def at(grid_of, x, steps):
    """A (num_steps, num_envs) tensor's values at the samples of minibatch x, in the minibatch's order (`steps`: the
    rollout's steps of each env, `training_steps`)."""
    _, env_ids, sample_steps = ids(x)
    where = [(int((steps[:, e] == c).nonzero()), e) for e, c in zip(env_ids, sample_steps, strict=True)]
    return torch.stack([grid_of[t, e] for t, e in where])


@pytest.mark.parametrize("name", SCRIPTS)
def test_vtrace_is_metta_s_per_minibatch_over_segments_with_refreshed_values(name, tmp_path, monkeypatch):
    """As Metta's PPO loss: each epoch starts from GAE over the batch with the values as the earlier minibatches left
    them (the first epoch: the rollout's); a minibatch is whole env segments, in Metta's order (every segment once an
    epoch); its policy advantages are V-trace's over its segments with its own ratios (at the first minibatch the
    ratio is 1, and they are GAE on those segments), normalised over the minibatch; its value targets are the epoch's
    GAE advantages plus the values as they are now. Explained variance is the rollout's values' (not the refreshed)."""
    flags = [*epochs(name, 2), "--vtrace", "--vtrace-rho-clip", "1.02", "--vtrace-c-clip", "0.99",
             "--learning-rate", "0.01", "--total-timesteps", str(NUM_ENVS * NUM_STEPS),
             *(["--n-iteration", "1"] if is_ppg(name) else [])]  # fmt: skip
    recorder, scalars = train(name, monkeypatch, tmp_path, flags)
    calls = recorder.of("compute_gae")
    whole, per_mb = [c for c in calls if len(c[0]) == 7], [c for c in calls if len(c[0]) == 10]
    updates = [(x, out) for kind, x, out in recorder.calls if kind == "update"]
    policy_in = [inputs for inputs, _ in recorder.of("clipped_policy_loss")]
    value_in = [inputs for inputs, _ in recorder.of("clipped_value_loss")]
    assert len(whole) == 3 and len(per_mb) == len(updates) == len(policy_in) == 4  # the rollout's, 2 epochs of 2
    steps = training_steps(recorder, 0)
    # Metta's sequential order: minibatch k is the k-th run of consecutive segments, every epoch
    assert [sorted(set(ids(x)[1].tolist())) for x, _ in updates] == [[0, 1], [2, 3]] * 2

    rollout_values = whole[0][0][1]
    y_true, y_pred = whole[0][1][1].flatten().numpy(), rollout_values.flatten().numpy()  # as the script computes it
    explained = np.float32(1 - np.var(y_true - y_pred) / np.var(y_true))
    assert scalars["losses/explained_variance"][0][1] == explained
    torch.testing.assert_close(whole[1][0][1], rollout_values)  # the first epoch starts from the rollout's values
    refreshed = rollout_values.clone()  # the second, from those the first epoch's minibatches computed, where they went
    for x, out in updates[:2]:
        for (e, c), v in by_sample(x, out[3].flatten()).items():
            refreshed[int((steps[:, e] == c).nonzero()), e] = v
    torch.testing.assert_close(whole[2][0][1], refreshed)
    assert not torch.equal(refreshed, rollout_values)
    # and its bootstrap value is the current network's, valued just before it
    before = recorder.calls[: [k for k, c in enumerate(recorder.calls) if c[0] == "compute_gae" and len(c[1]) == 7][2]]
    torch.testing.assert_close(whole[2][0][3].flatten(), [c for c in before if c[0] == "value"][-1][2].flatten())
    assert not torch.equal(whole[2][0][3], whole[1][0][3])
    ratios = []
    minibatches = zip(updates, per_mb, policy_in, value_in, strict=True)
    for k, ((x, _), (inputs, output), policy, value) in enumerate(minibatches):
        segments = ids(x)[1].view(NUM_STEPS, -1)
        assert (segments == segments[0]).all() and len(set(segments[0].tolist())) == segments.shape[1]  # whole ones
        epoch_gae = whole[1 + k // 2][1][0]
        torch.testing.assert_close(value[2], at(epoch_gae, x, steps) + value[1])  # the epoch's GAE + the values now
        rewards, values, dones, next_value, next_done, gamma, lam, ratio, rho_clip, c_clip = inputs
        assert (rho_clip, c_clip) == (1.02, 0.99)
        torch.testing.assert_close(values.flatten(), value[1])  # over the values as they are now
        torch.testing.assert_close(ratio.flatten(), policy[0].exp())  # the minibatch's own ratios
        hand = hand_gae(rewards, values, dones, next_value, next_done, gamma, lam, ratio, rho_clip, c_clip)[0]
        torch.testing.assert_close(output[0].double(), torch.as_tensor(hand), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(policy[1], normalised(output[0].flatten()))  # the policy loss takes them
        ratios.append(ratio)
    later = torch.cat([r.flatten() for r in ratios[2:]])
    for clip in (1.02, 0.99):  # the clips matter: ratios on both sides of each
        assert (later > clip).any() and (later < clip).any()
    # the share of ratios above the clip, over every minibatch of the iteration (their mean)
    clipped = torch.stack([(r > 1.02).float().mean() for r in ratios]).mean().item()
    assert clipped > 0 and scalars["losses/vtrace_rho_clipfrac"][0][1] == pytest.approx(clipped, rel=1e-6)


@pytest.mark.parametrize("name", SCRIPTS)
def test_vtrace_s_value_targets_never_see_the_minibatch_normalisation(name, tmp_path, monkeypatch):
    """With `--norm-adv-minibatch` too, a minibatch's value targets are the epoch's GAE advantages plus its values as
    they are now (not advantages normalised first), and its policy advantages, V-trace's, are normalised again by the
    minibatch's own mean and population std."""
    flags = ["--vtrace", "--norm-adv-minibatch", "--total-timesteps", str(NUM_ENVS * NUM_STEPS),
             *(["--n-iteration", "1"] if is_ppg(name) else [])]  # fmt: skip
    recorder, _ = train(name, monkeypatch, tmp_path, flags)
    whole = [c for c in recorder.of("compute_gae") if len(c[0]) == 7]
    updates = [x for kind, x, _ in recorder.calls if kind == "update"]
    value_in = [inputs for inputs, _ in recorder.of("clipped_value_loss")]
    policy_in = [inputs for inputs, _ in recorder.of("clipped_policy_loss")]
    steps = training_steps(recorder, 0)
    assert len(updates) == len(value_in) == len(policy_in) >= 2
    for k, (x, value, policy) in enumerate(zip(updates, value_in, policy_in, strict=True)):
        torch.testing.assert_close(value[2], at(whole[1 + k // 2][1][0], x, steps) + value[1])
        assert abs(policy[1].mean().item()) < 1e-5 and policy[1].std(correction=0).item() == pytest.approx(1, abs=1e-4)


@pytest.mark.parametrize("name", SCRIPTS)
def test_vtrace_at_ratio_one_is_gae_on_the_minibatch_s_segments(name, tmp_path, monkeypatch):
    """The first minibatch, before any optimizer step, has ratios of 1: with the clips at 1, its V-trace advantages
    are the epoch's GAE advantages on its segments (each segment bootstrapped from its own next value)."""
    flags = [
        "--vtrace",
        "--total-timesteps",
        str(NUM_ENVS * NUM_STEPS),
        *(["--n-iteration", "1"] if is_ppg(name) else []),
    ]
    recorder, _ = train(name, monkeypatch, tmp_path, flags)
    calls = recorder.of("compute_gae")
    epoch_gae, first_mb = [c for c in calls if len(c[0]) == 7][1], [c for c in calls if len(c[0]) == 10][0]
    first = ids(next(x for kind, x, _ in recorder.calls if kind == "update"))[1].view(NUM_STEPS, -1)[0]
    torch.testing.assert_close(first_mb[0][7], torch.ones_like(first_mb[0][7]), rtol=0, atol=1e-5)
    torch.testing.assert_close(first_mb[1][0], epoch_gae[1][0][:, first], rtol=1e-4, atol=1e-5)


def spy(monkeypatch, script, name, record):
    """`script.name`, with each call's inputs and output appended to `record`."""
    function = getattr(script, name)

    def recorded(*args):
        out = function(*args)
        record.append((args, out))
        return out

    monkeypatch.setattr(script, name, recorded)


@pytest.mark.parametrize("name", SCRIPTS)
def test_prioritised_segments_follow_the_advantages_and_weight_the_policy_loss(name, tmp_path, monkeypatch):
    """As Metta's PPO loss: priorities are each env's sum of |advantage|; a minibatch is whole segments drawn without
    replacement, P = (p^alpha + 1e-6) / (sum p^alpha + 1e-6), weighted (N P)^-beta; the logged policy loss is the
    weighted mean sum(w x) / n, the value loss a plain mean; beta goes as beta0 + (1 - beta0) alpha epoch / epochs."""
    drawn = []
    patch = lambda script: spy(monkeypatch, script, "prioritized_segments", drawn)  # noqa: E731
    flags = ["--prio-alpha", "0.8", "--prio-beta0", "0.3", "--num-minibatches", "2"]
    recorder, scalars = train(name, monkeypatch, tmp_path, flags, patch=patch)
    gaes, updates = recorder.of("compute_gae"), [x for kind, x, _ in recorder.calls if kind == "update"]
    assert len(drawn) * 2 == len(updates)  # a draw an epoch, of two minibatches
    for k, ((priorities, num_minibatches, alpha, beta), (segments, weights)) in enumerate(drawn):
        iteration = k // (len(drawn) // 2)
        assert beta == pytest.approx(0.3 + 0.7 * 0.8 * iteration / 2)  # 2 iterations: 0.58 at the last
        np.testing.assert_allclose(priorities, gaes[iteration][1][0].abs().sum(0).numpy(), rtol=1e-6)
        assert np.ptp(priorities) > 0.1 * priorities.mean()  # unequal priorities: uniform ones would be told apart
        probs = (priorities**alpha + 1e-6) / ((priorities**alpha).sum() + 1e-6)
        np.testing.assert_allclose(weights, (len(priorities) * probs[segments]) ** -beta, rtol=1e-6)
        for m in range(num_minibatches):  # each minibatch is its drawn segments, each once, every step of them
            assert len(set(segments[m].tolist())) == len(segments[m])
            x = updates[k * num_minibatches + m]
            assert sorted(ids(x)[1].tolist()) == sorted(np.repeat(segments[m], NUM_STEPS).tolist())
    assert scalars["charts/prio_beta"][-1][1] == pytest.approx(0.58)
    # the last minibatch's logged losses: the policy's weighted by its segments' weights, the value's a plain mean
    segments, weights = drawn[-1][1]
    weight_of = dict(zip(segments[-1].tolist(), weights[-1].tolist(), strict=True))
    w = torch.tensor([weight_of[int(i)] for i in ids(updates[-1])[1]])
    policy_loss, value_loss = (
        recorder.of(loss)[-1][1].detach() for loss in ("clipped_policy_loss", "clipped_value_loss")
    )
    logged = {tag: scalars[f"losses/{tag}"][-1][1] for tag in ("policy_loss", "value_loss")}
    assert logged["policy_loss"] == pytest.approx(float((w * policy_loss).mean()), rel=1e-5, abs=1e-7)
    assert abs(float(policy_loss.mean()) - logged["policy_loss"]) > 1e-3 * abs(logged["policy_loss"])  # weights matter
    assert logged["value_loss"] == pytest.approx(float(value_loss.mean()), rel=1e-5, abs=1e-7)
    assert abs(float((w * value_loss).mean()) - logged["value_loss"]) > 1e-3 * abs(logged["value_loss"])


@pytest.mark.parametrize("name", SCRIPTS)
def test_rnd_s_predictor_learns_inside_train(name, tmp_path, monkeypatch):
    """After 8 iterations the predictor's error on the last rollout's observations (normalised alike) has fallen
    below half of what the untrained predictor makes of them."""
    first_predictor = []

    def patch(script):
        reward = script.RND.intrinsic_reward

        def keep_the_first(self, *args):
            if not first_predictor:
                first_predictor.append(copy.deepcopy(self.predictor))
            return reward(self, *args)

        monkeypatch.setattr(script.RND, "intrinsic_reward", keep_the_first)

    flags = ["--intrinsic-coef", "0.5", "--rnd-obs-norm-steps", "8", "--total-timesteps", str(8 * NUM_ENVS * NUM_STEPS)]
    flags += ["--learning-rate", "1e-3", *epochs_flag(name, 3)]  # PPG's 3 policy epochs: PPO's predictor steps
    recorder, _ = train(name, monkeypatch, tmp_path, flags, patch=patch)
    rnd, obs = recorder.agents[0].rnd, training_obs(recorder)[-NUM_STEPS:].flatten(0, 1)
    with torch.no_grad():
        trained = rnd.prediction_error(obs).mean().item()
        rnd.predictor, trained_predictor = first_predictor[0], rnd.predictor
        untrained = rnd.prediction_error(obs).mean().item()
        rnd.predictor = trained_predictor
    assert trained < 0.5 * untrained, (trained, untrained)


@pytest.mark.parametrize("name", SCRIPTS)
def test_pretraining_drops_a_game_reward_that_is_there(name, tmp_path, monkeypatch):
    """The scripted games pay every step; in pretraining GAE sees the intrinsic reward alone, without it the sum."""
    intrinsic = []

    def patch(script):
        reward = script.RND.intrinsic_reward
        monkeypatch.setattr(script.RND, "intrinsic_reward", lambda self, *a: intrinsic.append(reward(self, *a))
                            or intrinsic[-1])  # fmt: skip

    for pretraining in (True, False):
        intrinsic.clear()
        flags = ["--intrinsic-coef", "0.5", "--rnd-obs-norm-steps", "0", *(["--pretraining"] if pretraining else [])]
        recorder, _ = train(name, monkeypatch, tmp_path / str(pretraining), flags, patch=patch)
        rewards = recorder.of("compute_gae")[0][0][0]
        game = grid(training_steps(recorder, 0), {(i, c): c + 100 * i for i in range(NUM_ENVS)
                                                  for c in range(NUM_STEPS)}).float()  # fmt: skip
        assert game.abs().sum() > 0
        expected = 0.5 * intrinsic[0] + (0 if pretraining else game)
        torch.testing.assert_close(rewards, expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", SCRIPTS)
def test_bf16_autocast_runs_the_encoders_in_bf16_and_the_heads_in_fp32(name, tmp_path, monkeypatch):
    """The dtypes seen inside the forward pass: every encoder's convolutions give bf16, in the rollout and in the
    update, and the heads give fp32."""
    seen = {}

    def watch(agent):
        for key, module in [("encoder", agent.network[0]), ("head", agent.actor), ("head", agent.critic)] + (
            [("encoder", agent.value_network[0])] if getattr(agent, "arch", "") == "dual" else []
        ):
            module.register_forward_hook(lambda m, i, out, key=key: seen.setdefault(
                (key, torch.is_grad_enabled()), set()).add(out.dtype))  # fmt: skip

    train(name, monkeypatch, tmp_path, ["--autocast", "bf16"], init=watch)
    assert seen == {("encoder", False): {torch.bfloat16}, ("encoder", True): {torch.bfloat16},
                    ("head", False): {torch.float32}, ("head", True): {torch.float32}}, seen  # fmt: skip


def saved_agent(name, tmp_path, monkeypatch):
    """The script, run from tmp_path, beside a freshly built agent (16 features) saved as `saved.cleanrl_model`."""
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    agent = script.Agent((64, 64, 3), 15, 16, script.Args.init_fn, *(["dual"] if is_ppg(name) else []))
    torch.save(agent.state_dict(), tmp_path / "saved.cleanrl_model")
    return script


@pytest.mark.parametrize("name", SCRIPTS)
def test_eval_only_plays_the_levels_it_is_asked_for(name, tmp_path, monkeypatch):
    script = saved_agent(name, tmp_path, monkeypatch)
    flags = ["--feature-dim", "16", "--num-levels", "7", "--start-level", "3", "--device", "cpu", "--eval-only",
             "saved.cleanrl_model", "--eval-episodes", "4", "--num-eval-envs", "2"]  # fmt: skip
    for extra, levels in (([], (0, 0)), (["--eval-train-levels"], (7, 3))):
        recorder = Recorder(script, monkeypatch)
        returns = script.train(parse(script, [*flags, *extra]))
        (env,) = type(recorder.train_env).made
        assert (env.kwargs["num_levels"], env.kwargs["start_level"]) == levels and len(returns) == 4


@pytest.mark.parametrize("name", SCRIPTS)
def test_eval_only_is_seeded_by_seed(name, tmp_path, monkeypatch):
    """`--eval-only` at one `--seed` plays the same actions on every call, whatever came before it in the process."""
    script = saved_agent(name, tmp_path, monkeypatch)
    flags = ["--feature-dim", "16", "--device", "cpu", "--eval-only", "saved.cleanrl_model", "--eval-episodes", "2",
             "--num-eval-envs", "2"]  # fmt: skip
    actions = []
    for seed in ("1", "1", "2"):
        recorder = Recorder(script, monkeypatch)
        script.train(parse(script, [*flags, "--seed", seed]))
        actions.append(torch.cat([out[0] for kind, _, out in recorder.calls if kind == "act"]))
        torch.rand(3)  # the global generator moved on between the calls
    assert torch.equal(actions[0], actions[1]) and not torch.equal(actions[0], actions[2])


@pytest.mark.parametrize("name", SCRIPTS)
def test_under_torchrun_each_process_plays_its_own_levels_and_every_episode_is_logged(name, tmp_path):
    """Each process's games get their own seed, and its test envs' actions their own draws; every process's episodes
    reach rank 0's log; nothing of the process group is left when `train()` returns."""
    # 2 of the 4 envs and 1 test env a process
    flags = [*SMALL, *(PPG if is_ppg(name) else []), *NARROW, "--exp-name", "ddp"]
    proc = torchrun([str(ROOT / "tests" / "helpers" / "ddp_train.py"), name, str(tmp_path / "out"), *flags], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"out.rank{rank}.json").read_text()) for rank in (0, 1)]
    seeds = [seed for rank in ranks for seed in rank["seeds"]]  # training and test envs of rank 0, then of rank 1
    assert len(seeds) == len(set(seeds)) == 4, seeds
    test_draws = [{seed for seed in rank["torch_seeds"] if seed >= 1_000_003} for rank in ranks]  # the test loop's
    assert len(test_draws[0]) == 2 and not test_draws[0] & test_draws[1], test_draws  # one an iteration, its own
    scalars = read_scalars(tmp_path / "runs" / ranks[0]["run_name"])
    for k, tag in enumerate(("charts/episodic_return", "charts/test_episodic_return")):
        assert len(scalars[tag]) == sum(rank["episodes"][k] for rank in ranks) > 0, tag
    # the process group is gone with its gloo threads, which would otherwise be torn down with Python and may abort
    # the process (exit status -6, and torchrun restarts a finished job)
    assert not [t for rank in ranks for t in rank["threads"] if "gloo" in t], [rank["threads"] for rank in ranks]


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_folded_rollout_logs_what_the_plain_rollout_logs(name, tmp_path, monkeypatch):
    """On procgen's own games (bigfish, whose episodes end and draw new levels within the run): the test envs folded
    into the rollout's forward pass log every loss, return and test return of the plain rollout, bit for bit; and
    the training envs' step, then the test envs', did start ahead of `envs.step`, every step, in that order. The
    noise drawn ahead is drawn a step's at a time, in the plain loops' shapes: a GPU's generator gives one tensor of
    all the steps other numbers (a CPU's does not, so the shapes are what a CPU can check)."""
    script = load_script(name)
    started, ahead, draws = [], script.plumbing.AheadSteps, []
    act_ahead, exponential_ = ahead.act_ahead, torch.Tensor.exponential_
    monkeypatch.setattr(ahead, "act_ahead", lambda self, a: started.append(len(a)) or act_ahead(self, a))
    monkeypatch.setattr(torch.Tensor, "exponential_", lambda x: draws.append(tuple(x.shape)) or exponential_(x))
    flags = ["--env-id", "bigfish", "--num-envs", "8", "--num-steps", "64", "--total-timesteps", "1024",
             "--num-minibatches", "2", "--num-eval-envs", "4", "--device", "cpu", *NARROW,
             *(PPG[:-2] + ["--e-auxiliary", "2"] if is_ppg(name) else [])]  # fmt: skip
    logged, drawn = {}, {}
    for rollout in ("plain", "folded"):
        started.clear()
        draws.clear()
        (tmp_path / rollout).mkdir()
        monkeypatch.chdir(tmp_path / rollout)
        run_name = script.train(parse(script, [*flags, "--rollout", rollout]))
        scalars = read_scalars(tmp_path / rollout / "runs" / run_name)
        logged[rollout] = {tag: rows for tag, rows in scalars.items() if tag.startswith(("losses/", "charts/episodic",
                                                                                         "charts/test"))}  # fmt: skip
        # the training envs' 8 games, then the test envs' 4, at each of the 2 x 64 steps
        assert started == ([8, 4] * 128 if rollout == "folded" else []), started
        drawn[rollout] = collections.Counter(draws)
    assert logged["plain"]["charts/episodic_return"] and logged["plain"]["charts/test_episodic_return"]
    assert logged["folded"] == logged["plain"]
    assert drawn["plain"][(8, 15)] == 128 and drawn["folded"] == drawn["plain"], drawn


def test_the_folded_rollout_trains_alike_with_and_without_evaluation_where_a_batch_rounds_by_its_size(
    tmp_path, monkeypatch
):
    """A GPU may round a forward pass of 64 observations otherwise than one of 64 + 16: here a policy step whose value
    moves with the batch's size stands in for it. With the test envs folded in, the training envs' forward pass never
    holds the test envs' observations, so the training numbers are those of a run without evaluation."""
    script = load_script("ppo_procgen_full")
    policy_step = script.policy_step

    def rounded_by_batch_size(agent, x, noise=None):
        action, logprob, value = policy_step(agent, x, noise)
        return action, logprob, value + 1e-3 * len(x)

    monkeypatch.setattr(script, "policy_step", rounded_by_batch_size)
    flags = ["--env-id", "bigfish", "--num-envs", "8", "--num-steps", "64", "--total-timesteps", "1024"]
    flags += ["--num-minibatches", "2", "--num-eval-envs", "4", "--device", "cpu", "--rollout", "folded", *NARROW]
    logged = []
    for evaluation in ("1", "0"):
        (tmp_path / evaluation).mkdir()
        monkeypatch.chdir(tmp_path / evaluation)
        run_name = script.train(parse(script, [*flags, "--eval-interval", evaluation]))
        scalars = read_scalars(tmp_path / evaluation / "runs" / run_name)
        logged.append({tag: rows for tag, rows in scalars.items() if tag.startswith(("losses/", "charts/episodic"))})
    assert "charts/test_episodic_return" in scalars or evaluation == "0"
    assert logged[0]["losses/value_loss"] and logged[0] == logged[1]


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_procgen_paper_s_ppo_setup_normalises_as_it_did(name, tmp_path, monkeypatch):
    """`--norm-reward-gamma` is the discount of reward normalisation's return (by default the training discount), and
    `--norm-adv-minibatch` hands every minibatch's policy loss advantages of mean 0 and population std 1 (numpy's,
    as baselines' PPO2 computed them), where the batch's normalisation alone leaves a minibatch's off."""
    import gymnasium as gym

    made = []

    class Recording(gym.wrappers.vector.NormalizeReward):
        def __init__(self, env, gamma=0.99, epsilon=1e-8):
            made.append(gamma)
            super().__init__(env, gamma=gamma, epsilon=epsilon)

    monkeypatch.setattr(gym.wrappers.vector, "NormalizeReward", Recording)
    moments = {}
    for setup in ([], ["--norm-reward-gamma", "0.9", "--norm-adv-minibatch"]):
        flags = [*setup, "--norm-reward", "--num-minibatches", "4"]  # the loop tests run without it
        recorder, _ = train(name, monkeypatch, tmp_path / str(len(flags)), flags)
        advantages = [inputs[1].double() for inputs, _ in recorder.of("clipped_policy_loss")]
        moments[bool(setup)] = [(float(a.mean()), float(a.std(correction=0))) for a in advantages]
    assert made == [0.999, 0.9]
    for mean, std in moments[True]:
        assert mean == pytest.approx(0, abs=1e-6) and std == pytest.approx(1, rel=1e-5)
    assert max(abs(mean) for mean, _ in moments[False]) > 0.01  # without the flag: told apart


@pytest.mark.parametrize("name", SCRIPTS)
def test_rnd_s_discount_and_observation_warm_up_are_rnd_s(name, tmp_path, monkeypatch):
    """The intrinsic return's discount is `--intrinsic-gamma` (RND's 0.99 by default, not `--gamma`), and RND's
    observation statistics start from `--rnd-obs-norm-steps` random-policy steps of every env before the first
    rollout, which then begins where those steps left the games."""
    for warm_up, gamma in ((3, []), (0, ["--intrinsic-gamma", "0.5"])):
        flags = ["--intrinsic-coef", "0.5", "--rnd-obs-norm-steps", str(warm_up), *gamma]
        recorder, _ = train(name, monkeypatch, tmp_path / str(warm_up), flags)
        rnd = recorder.agents[-1].rnd
        assert rnd.gamma == (0.5 if gamma else 0.99)
        assert int(rnd.obs_count) == (warm_up + 2 * NUM_STEPS) * NUM_ENVS  # and two rollouts' observations
        assert (training_steps(recorder, 0)[0] == warm_up).all()


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_perf_timers_add_up_every_step(tmp_path, monkeypatch, name):
    """[32] perf/env_seconds is every step's stepping of the games, not the last step's: games made 5 ms slower a
    step log at least the rollout's steps x 5 ms an iteration, and the parts fit inside the iteration's seconds."""
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    step = script.ProcgenVecEnv.step
    monkeypatch.setattr(script.ProcgenVecEnv, "step", lambda self, actions: time.sleep(0.005) or step(self, actions))
    flags = [*smoke_args(name), "--device", "cpu", "--eval-interval", "0"]
    scalars = read_scalars(tmp_path / "runs" / script.train(parse(script, flags)))
    for iteration, (_, env_seconds) in enumerate(scalars["perf/env_seconds"]):
        parts = sum(scalars[f"perf/{part}_seconds"][iteration][1] for part in ("env", "inference", "eval", "update"))
        assert 32 * 0.005 <= env_seconds and parts <= scalars["perf/iteration_seconds"][iteration][1]
