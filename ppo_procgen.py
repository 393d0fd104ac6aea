# PPO: https://arxiv.org/abs/1707.06347 -- Procgen setup of PPG: https://arxiv.org/abs/2009.04416
# /// script
# requires-python = ">=3.10,<3.14"
# dependencies = [
#     'torch==2.13.0',
#     'procgen==0.10.7; python_version < "3.11"',
#     'procgen-mirror==0.10.7; python_version >= "3.11" and python_version < "3.13"',
#     'procgen-gym==0.1.1; python_version >= "3.13"',
#     'numpy<2; python_version < "3.13"',
#     'gymnasium>=1.4,<2',
#     'tyro>=0.9',
#     'tensorboard>=2.10',
#     'setuptools<81; python_version < "3.13"',
#     'imageio-ffmpeg>=0.5; python_version >= "3.13"',
# ]
# ///
"""PPO on Procgen: the Procgen paper's easy setup (starpilot, 200 training levels, 25M steps, 64 envs x 256 steps,
8 minibatches, 3 epochs), held-out test levels. The lean reference; ppo_procgen_full.py adds checkpoints, torchrun, RND,
V-trace and more. A quick look on a CPU: python ppo_procgen.py --total-timesteps 8192 --num-envs 8 --num-steps 64"""

import contextlib
import ctypes
import importlib.util
import io
import itertools
import os
import random
import re
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

SCRIPT = os.path.basename(__file__)[: -len(".py")]
if not (3, 10) <= sys.version_info[:2] <= (3, 13):  # no procgen package is built for another Python (requirements.txt)
    sys.exit(f"{SCRIPT}.py: error: Python {sys.version.split()[0]} has no procgen package: use Python 3.10 to 3.13")

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

with contextlib.redirect_stderr(io.StringIO()):  # the old `gym` that procgen imports prints a notice
    try:
        from procgen import ProcgenGym3Env as Procgen  # procgen (Python 3.10), procgen-mirror (3.11, 3.12)
    except ImportError:
        from procgen_gym import ProcgenVecEnv as Procgen  # procgen-gym (3.13): the same C++ games

PROCGEN_GAMES = ("bigfish bossfight caveflyer chaser climber coinrun dodgeball fruitbot heist jumper leaper maze miner "
                 "ninja plunder starpilot").split()  # fmt: skip
MODE_GAMES = {"extreme": "chaser dodgeball leaper starpilot", "memory": "caveflyer dodgeball heist jumper maze miner",
              "exploration": "caveflyer climber coinrun heist jumper leaper maze ninja"}  # fmt: skip


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment, part of the run name"""
    seed: int = 1
    """seed of python, numpy, torch and procgen's level generator: one seed gives one run"""
    torch_deterministic: bool = True
    """if toggled, deterministic cuDNN (its TF32 convolutions stay on, torch's default): a GPU run repeats itself"""
    device: str = "auto"
    """`auto` (CUDA when available, else CPU), `cpu`, `cuda` or `cuda:N`"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "procgen"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """if toggled, write videos of test env 0 (episodes 0, 1, 8, 27, ...) to `videos/{run_name}`"""
    env_id: str = "starpilot"
    """the Procgen game"""
    num_levels: int = 200
    """the number of training levels (200 for easy, 500 for hard in the Procgen paper; 0 = unlimited)"""
    start_level: int = 0
    """the first training level"""
    distribution_mode: Literal["easy", "hard", "extreme", "memory", "exploration"] = "easy"
    """the Procgen difficulty (exploration: one fixed level per game, so it trains and tests on that level)"""
    eval_interval: int = 1
    """step the held-out test env (all levels) for `num_steps` steps every this many iterations; 0 = off"""
    num_eval_envs: int = 16
    """the number of parallel test envs"""
    total_timesteps: int = 25_000_000
    """total timesteps of the experiment"""
    learning_rate: float = 5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 64
    """the number of parallel game environments"""
    num_steps: int = 256
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = False
    """if toggled, the learning rate decays linearly to 0 over the whole run (the PPG paper keeps it constant)"""
    gamma: float = 0.999
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches"""
    update_epochs: int = 3
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization (over the whole batch)"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_range_vf: float | None = 0.2
    """the value clipping range, not tied to `clip_coef`; None: no value clipping (CleanRL's `--no-clip-vloss`)"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence: the update stops after an epoch whose last minibatch's approx_kl exceeds it"""
    norm_reward: bool = True
    """toggles reward normalisation by a running estimate of the discounted return's std"""
    clip_reward: float = 10.0
    """normalised rewards are clipped to [-clip_reward, clip_reward]"""
    feature_dim: int = 256
    """the size of the encoder's output (the dense layer after the IMPALA CNN)"""
    init_fn: Literal["orthogonal", "torch_default", "tf_default", "normed"] = "orthogonal"
    """orthogonal everywhere (ours); a PyTorch-default (CleanRL) or glorot (the Procgen paper) trunk; normed (PPG's)"""
    save_model: bool = False
    """if toggled, save the agent's weights to `runs/{run_name}/{exp_name}.cleanrl_model` at the end"""


class ProcgenVecEnv(gym.vector.VectorEnv):
    """[1] Procgen as one gymnasium vector env; a finished env restarts in the same `step` (SAME_STEP autoreset)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "render_fps": 15}

    def __init__(self, num_envs, seed, video_dir=None, **procgen_kwargs):
        if procgen_kwargs["distribution_mode"] == "exploration":  # one fixed level per game: procgen picks it
            procgen_kwargs = {k: v for k, v in procgen_kwargs.items() if k not in ("num_levels", "start_level")}
        # [2] Seeded level generator: `rand_seed` fixes which levels each env plays and in what order.
        self.env = Procgen(num=num_envs, rand_seed=seed, **procgen_kwargs)
        self.num_envs, self.gym3 = num_envs, hasattr(self.env, "act")  # procgen's gym3 env, or procgen-gym's
        self.video_dir, self.video_episode, self.frames = video_dir, 0, []  # `--capture-video`: env 0's episodes
        self.single_observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)  # procgen's RGB frames
        self.single_action_space = gym.spaces.Discrete(15)  # procgen's button combinations, the same in every game
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed=None, options=None):
        obs = self.env.observe()[1]["rgb"] if self.gym3 else self.env.reset()[0]
        self.frames = [obs[0]]
        return obs, {}

    def step(self, actions):
        if self.gym3:
            self.env.act(np.asarray(actions, dtype=np.int32))
            reward, obs, first = self.env.observe()
            obs = obs["rgb"]
        else:  # procgen-gym's "terminated" is procgen's `first`: the same-step reset, whatever its metadata says
            obs, reward, first, _, _ = self.env.step(np.asarray(actions, dtype=np.int32))
        if self.video_dir is not None:
            self.record(obs[0], first[0])
        return obs, reward, first, np.zeros_like(first), {}

    def record(self, frame, episode_ended):
        """Keep the frames of env 0 and write episodes 0, 1, 8, 27, ... as mp4 files."""
        if episode_ended and round(self.video_episode ** (1 / 3)) ** 3 == self.video_episode:
            with contextlib.redirect_stderr(io.StringIO()):  # gym3's pinned imageio-ffmpeg warns about pkg_resources
                import imageio_ffmpeg
            path = f"{self.video_dir}/episode-{self.video_episode}.mp4"
            writer = imageio_ffmpeg.write_frames(path, frame.shape[1::-1], fps=15, macro_block_size=1)
            for f in [None, *map(np.ascontiguousarray, self.frames)]:  # None starts imageio_ffmpeg's generator
                writer.send(f)
            writer.close()
            console(f"video: {path}")
        if episode_ended:
            self.video_episode, self.frames = self.video_episode + 1, []
        self.frames.append(frame)


def make_envs(num_envs, seed, num_levels, start_level, args: Args, video_dir=None):
    """`num_envs` games on levels [start_level, start_level + num_levels) (0 levels: all), with episode statistics."""
    envs = ProcgenVecEnv(num_envs, seed, video_dir, env_name=args.env_id, distribution_mode=args.distribution_mode,
                         num_levels=num_levels, start_level=start_level)  # fmt: skip
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP, "`dones` needs same-step resets"
    return envs


# [3] Initialisation: `std` is the L2 norm of each output unit's weights (orthogonal rows have norm `gain`).
def layer_init(layer, std=np.sqrt(2), init_fn="orthogonal", bias_const=0.0):
    if init_fn == "orthogonal":
        torch.nn.init.orthogonal_(layer.weight, std)
    elif init_fn == "tf_default":  # glorot-uniform at gain 1 whatever `std` says, and zero biases
        torch.nn.init.xavier_uniform_(layer.weight)
    elif init_fn == "normed":  # Gaussian weights rescaled per output unit (OpenAI's PPG code rescales torch's uniform)
        with torch.no_grad():
            layer.weight.normal_()
            layer.weight.mul_(std / layer.weight.flatten(1).norm(dim=1).view(-1, *[1] * (layer.weight.dim() - 1)))
    if init_fn != "torch_default":  # PyTorch's default keeps the weights and biases it was built with
        torch.nn.init.constant_(layer.bias, bias_const)
    return layer


# [4] IMPALA CNN (Espeholt et al., 2018): three stacks of conv, max-pool and two residual blocks.
class ResidualBlock(nn.Module):
    def __init__(self, channels, std, init_fn):
        super().__init__()
        self.conv0 = layer_init(nn.Conv2d(channels, channels, kernel_size=3, padding=1), std, init_fn)
        self.conv1 = layer_init(nn.Conv2d(channels, channels, kernel_size=3, padding=1), std, init_fn)

    def forward(self, x):
        return x + self.conv1(nn.functional.relu(self.conv0(nn.functional.relu(x))))


def impala_cnn(obs_shape, feature_dim, init_fn, stacks=(16, 32, 32)):
    """(height, width, channels) images -> `feature_dim` features; on Procgen 64x64x3 -> 32x32x16 -> 16x16x32 ->
    8x8x32 -> 256. Each of the six residual branches has a gain of 1/sqrt(6) (each of its two convs the square root
    of that), so that the six together add about as much variance as their input has (OpenAI's PPG code's scales)."""
    (height, width, channels), layers, block_std = obs_shape, [], np.sqrt(1 / np.sqrt(3) / np.sqrt(2))
    for out_channels in stacks:  # each stack's channels
        conv = layer_init(nn.Conv2d(channels, out_channels, kernel_size=3, padding=1), 1.0, init_fn)
        blocks = [ResidualBlock(out_channels, block_std, init_fn) for _ in range(2)]
        layers += [conv, nn.MaxPool2d(kernel_size=3, stride=2, padding=1), *blocks]
        channels, height, width = out_channels, (height + 1) // 2, (width + 1) // 2  # the max-pool halves, rounding up
    dense = layer_init(nn.Linear(channels * height * width, feature_dim), np.sqrt(2), init_fn)
    return nn.Sequential(*layers, nn.Flatten(), nn.ReLU(), dense, nn.ReLU())


def preprocess(x):
    return x.permute((0, 3, 1, 2)) / 255.0  # "bhwc" -> "bchw", uint8 -> [0, 1]


class Agent(nn.Module):
    def __init__(self, obs_shape, num_actions, feature_dim, init_fn):
        super().__init__()
        self.network = impala_cnn(obs_shape, feature_dim, init_fn)
        # [3] Heads: policy gain 0.01 (near-uniform first actions), value gain 1; orthogonal after a default trunk
        actor_std, critic_std = (0.1, 0.1) if init_fn == "normed" else (0.01, 1.0)
        head_fn = "orthogonal" if init_fn.endswith("_default") else init_fn
        self.actor = layer_init(nn.Linear(feature_dim, num_actions), actor_std, head_fn)
        self.critic = layer_init(nn.Linear(feature_dim, 1), critic_std, head_fn)

    def get_value(self, x):
        return self.critic(self.network(preprocess(x)))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(preprocess(x))
        probs = Categorical(logits=self.actor(hidden), validate_args=False)  # its checks would wait for the GPU
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


# [5] GAE (Schulman et al. 2016) over (num_steps, num_envs): dones[t] = 1 if obs[t] starts an episode; next_* bootstrap
def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    nextvalues = torch.cat([values[1:], next_value.view(1, -1)])  # the value and the done after each step
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done.view(1, -1)])
    advantages, lastgaelam = torch.zeros_like(rewards), 0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * nextvalues[t] * nextnonterminal[t] - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal[t] * lastgaelam
    return advantages, advantages + values


# [6] The clipped surrogate objective, per sample, as a loss to minimise.
def clipped_policy_loss(logratio, advantages, clip_coef):
    ratio = logratio.exp()
    return torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef))


# [7] Value loss per sample: 0.5 max(clipped, unclipped) as in PPO2 and CleanRL (OpenAI's PPG code: no clip, no 0.5)
def clipped_value_loss(newvalue, oldvalue, returns, clip_range_vf):
    v_loss_unclipped = (newvalue - returns) ** 2
    if clip_range_vf is None:
        return 0.5 * v_loss_unclipped
    v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_range_vf, clip_range_vf)
    return 0.5 * torch.max(v_loss_unclipped, (v_clipped - returns) ** 2)


# [8] Minibatches: a fresh shuffle of the whole batch every epoch, sent to the device once, not once per minibatch.
def minibatch_indices(batch_size, minibatch_size, device):
    b_inds = torch.as_tensor(np.random.permutation(batch_size), device=device)
    return b_inds.split(minibatch_size)


# The loop's three stages (as LeanRL and purejaxrl cut theirs): the policy step, the advantages (`compute_gae`) and one
# update minibatch. None branches on data or reads a number back to the host: the full files compile each whole.
def policy_step(agent, next_obs):
    """Observation in; the sampled action, its log-probability and the value out."""
    with torch.no_grad():
        action, logprob, _, value = agent.get_action_and_value(next_obs)
    return action, logprob, value.flatten()


def update_minibatch(agent, optimizer, mb, args: Args):
    """Forward, the losses, backward, clipping and the optimizer's step on one minibatch; its statistics, on device"""
    mb_obs, mb_actions, mb_logprobs, mb_advantages, mb_returns, mb_values = mb
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, mb_actions)
    logratio = newlogprob - mb_logprobs
    ratio = logratio.exp()
    with torch.no_grad():  # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    pg_loss = clipped_policy_loss(logratio, mb_advantages, args.clip_coef).mean()
    v_loss = clipped_value_loss(newvalue[:, 0], mb_values, mb_returns, args.clip_range_vf).mean()
    entropy_loss = entropy.mean()  # [16] entropy bonus, keeps exploring
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    optimizer.zero_grad()
    loss.backward()
    # [17] Global gradient-norm clipping, as in CleanRL (OpenAI's PPG code does not clip).
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return torch.stack([v_loss, pg_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac]).detach()


def log_episodes(episodes, infos, global_step, tag):
    """[9] Keep every episode that ended in a step, not only the first; they are logged once per iteration."""
    for i in np.flatnonzero(infos.get("_episode", [])):
        episodes.append((tag, global_step, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))


def train(args: Args):
    check_args(args)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    tune_allocator()  # [10] speed only
    device = torch.device(args.device)
    run_dir = make_dir(f"runs/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}", "exp-name", new=True)
    run_name = os.path.basename(run_dir)  # with `_2`, `_3`, ... where other runs started in the same second
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=vars(args),
                   name=run_name, monitor_gym=True, save_code=True)  # fmt: skip
    writer = SummaryWriter(run_dir, max_queue=1000)  # an iteration's episodes queue up: the loop never waits on disk
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
    console(f"{SCRIPT}.py: {args.env_id}, {args.num_iterations} iterations of {args.batch_size} steps on {device}; "
            f"logs in runs/{run_name} (tensorboard --logdir runs)")  # fmt: skip

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.benchmark = not args.torch_deterministic  # GPUs only: set either way, torch's defaults vary

    # env setup: [11] training levels [start_level, start_level + num_levels), held-out test envs on all levels
    envs = make_envs(args.num_envs, args.seed, args.num_levels, args.start_level, args)
    if args.norm_reward:  # [12] scaled by the std of the discounted return (OpenAI's PPG code: gamma 0.99), clipped
        envs = gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma)
        envs = gym.wrappers.vector.TransformReward(envs, lambda r: np.clip(r, -args.clip_reward, args.clip_reward))
    if args.eval_interval > 0:
        video_dir = make_dir(f"videos/{run_name}", "capture-video") if args.capture_video else None
        test_envs = make_envs(args.num_eval_envs, args.seed + 1_000_003, 0, 0, args, video_dir)
        test_obs = torch.as_tensor(test_envs.reset()[0], device=device)

    agent = Agent(envs.single_observation_space.shape, envs.single_action_space.n, args.feature_dim, args.init_fn)
    agent = agent.to(device, memory_format=torch.channels_last)  # as the frames come (NHWC): no conversions
    # [13] Adam with epsilon 1e-5 as in baselines' PPO2 and CleanRL's PPO (OpenAI's PPG code: PyTorch's 1e-8).
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # ALGO Logic: Storage setup; observations stay uint8 until the network converts them
    obs = torch.zeros((args.num_steps, *envs.observation_space.shape), dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, envs.num_envs), dtype=torch.long, device=device)
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, envs.num_envs), device=device) for _ in range(4))

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    signal.signal(signal.SIGINT, lambda *_: sys.exit(f"\n{SCRIPT}.py: stopped; runs/{run_name} has what finished"))
    next_obs = torch.as_tensor(envs.reset()[0], device=device)  # procgen's levels were seeded when it was made
    next_done = torch.zeros(envs.num_envs, device=device)
    recent_returns, recent_test_returns, start_time = deque(maxlen=100), deque(maxlen=100), time.time()  # the console

    for iteration in range(1, args.num_iterations + 1):
        iteration_start, episodes = time.time(), []
        if args.anneal_lr:  # [14] learning-rate annealing over the whole run
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done
            # ALGO LOGIC: action logic
            action, logprobs[step], values[step] = policy_step(agent, next_obs)
            actions[step] = action
            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            rewards[step] = torch.as_tensor(reward, device=device).view(-1)
            next_obs = torch.as_tensor(next_obs, device=device)
            next_done = torch.as_tensor(np.logical_or(terminations, truncations), device=device, dtype=torch.float32)
            log_episodes(episodes, infos, global_step, "")

        if args.eval_interval > 0 and iteration % args.eval_interval == 0:  # [11] held-out levels, the same policy
            # their actions from a generator of their own, seeded anew each time: training's stay as they were
            with torch.random.fork_rng([device] if device.type == "cuda" else []):
                torch.manual_seed(args.seed + 1_000_003 + iteration)
                for _ in range(args.num_steps):
                    test_action = policy_step(agent, test_obs)[0]
                    test_obs, _, _, _, test_infos = test_envs.step(test_action.cpu().numpy())
                    test_obs = torch.as_tensor(test_obs, device=device)
                    log_episodes(episodes, test_infos, global_step, "test_")

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
        advantages, returns = compute_gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)
        # flatten the batch
        b_obs = obs.reshape((-1, *envs.single_observation_space.shape))
        b_logprobs, b_actions, b_values = logprobs.reshape(-1), actions.reshape(-1), values.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
        # [15] Advantages normalised over the whole batch, once (OpenAI's PPG code), not per minibatch (CleanRL's PPO).
        if args.norm_adv:
            b_mean, b_std = b_advantages.mean(), b_advantages.std()
            b_advantages = (b_advantages - b_mean) / (b_std + 1e-8)

        # Optimizing the policy and value network
        clipfracs, batch = [], (b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values)
        for epoch in range(args.update_epochs):  # noqa: B007
            for mb_inds in minibatch_indices(args.batch_size, args.minibatch_size, device):
                mb_stats = update_minibatch(agent, optimizer, [x[mb_inds] for x in batch], args)
                clipfracs.append(mb_stats[5])  # kept on the device, read once when logged: no sync per minibatch

            # [18] Early stop of the epochs once the policy moved too far, when `target_kl` is set.
            if args.target_kl is not None and mb_stats[4].item() > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        mb_stats[5] = torch.stack(clipfracs).mean()  # over the whole update; the losses and KLs: the last minibatch's
        names = "value_loss policy_loss entropy old_approx_kl approx_kl clipfrac".split()  # as update_minibatch's
        stats = {f"losses/{name}": value for name, value in zip(names, mb_stats.tolist(), strict=True)}
        stats |= {"losses/explained_variance": explained_var, "charts/learning_rate": optimizer.param_groups[0]["lr"]}
        for tag, value in stats.items():
            writer.add_scalar(tag, value, global_step)
        for tag, step, r, l in episodes:
            writer.add_scalar(f"charts/{tag}episodic_return", r, step)
            writer.add_scalar(f"charts/{tag}episodic_length", l, step)
            (recent_test_returns if tag else recent_returns).append(r)
        sps = global_step / (time.time() - start_time)
        writer.add_scalar("charts/SPS", int(sps), global_step)
        writer.flush()  # this iteration on disk before it is reported: a stop (Ctrl-C, a kill) loses none of it
        report(iteration, global_step, sps, time.time() - iteration_start, (recent_returns, recent_test_returns), args)

    envs.close()
    if args.eval_interval > 0:
        test_envs.close()
    writer.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.save_model:
        save_model(agent, f"runs/{run_name}/{args.exp_name}.cleanrl_model")
    return run_name


# What train() needs that is not the algorithm: the allocator, Ctrl-C, the console line and the model file.
def tune_allocator():
    """One glibc heap, never trimmed or unmapped: the update's large buffers are reused, not mapped anew each time."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to tune
        for option, value in ((-4, 0), (-1, 2**31 - 1), (-8, 1)):  # M_MMAP_MAX 0, M_TRIM_THRESHOLD max, M_ARENA_MAX 1
            ctypes.CDLL("libc.so.6").mallopt(option, value)


def report(iteration, global_step, sps, took, recent, args: Args):
    """The iteration's console line: steps, speed, time left, the means of the last 100 training and test returns."""
    left = (args.num_iterations * args.batch_size - global_step) / sps / 60
    means = [np.mean(returns or [np.nan]) for returns in recent]
    console(f"iter {iteration}/{args.num_iterations}  step {global_step}  SPS {sps:.0f}  ({took:.1f}s/iter, "
            f"{left:.1f} min left)  return {means[0]:.2f}  test {means[1]:.2f}")  # fmt: skip


def save_model(agent, model_path):
    """The weights, serialised first, so that a failed write (a full disk) is one line with the system's reason."""
    buffer = io.BytesIO()
    torch.save(agent.state_dict(), buffer)
    try:
        with open(model_path, "wb") as f:
            f.write(buffer.getbuffer())
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.remove(model_path)  # no partial file
        sys.exit(f"{SCRIPT}.py: error: {model_path} not written: {exc.strerror}; the logs beside it are kept")
    console(f"model saved to {model_path}")


# Command-line plumbing: every flag's rule, checked before anything is built or written, and the output directories.
RULES = {  # the rule of every flag: flags -> (rule, is `v` allowed given all flags `a`); a bool or Literal: its type
    ("exp_name", "wandb_project_name", "wandb_entity"): ("must not contain /", lambda v, a: "/" not in (v or "")),
    ("seed",): ("must be in [0, 2^30]: procgen's seeds are 31-bit, test envs add 1e6", lambda v, a: 0 <= v <= 2**30),
    ("device",): ("must be auto, cpu, cuda or cuda:N (not mps)", lambda v, a: re.fullmatch(r"auto|cpu|cuda(:\d+)?", v)),
    ("env_id",): (f"must be a Procgen game: {', '.join(PROCGEN_GAMES)}", lambda v, a: v in PROCGEN_GAMES),
    ("distribution_mode",): ("is not made for this game", lambda v, a: a.env_id in MODE_GAMES.get(v, a.env_id).split()),
    ("num_levels", "start_level", "eval_interval"): ("must be in [0, 2^31)", lambda v, a: 0 <= v < 2**31),
    ("num_envs", "num_eval_envs", "num_steps", "feature_dim"): ("must be in [1, 65536]", lambda v, a: 1 <= v <= 2**16),
    ("total_timesteps",): ("must hold one batch: --num-envs x --num-steps", lambda v, a: v >= a.num_envs * a.num_steps),
    ("learning_rate",): ("must be in (0, 1)", lambda v, a: 0 < v < 1),
    ("gamma", "gae_lambda"): ("must be in [0, 1]", lambda v, a: 0 <= v <= 1),
    ("num_minibatches",): ("must divide the batch", lambda v, a: v > 0 and a.num_envs * a.num_steps % v == 0),
    ("update_epochs", "clip_coef", "max_grad_norm", "clip_reward"): ("must be positive", lambda v, a: v > 0),
    ("ent_coef", "vf_coef"): ("must be >= 0", lambda v, a: v >= 0),
    ("clip_range_vf", "target_kl"): ("must be positive, or None: off", lambda v, a: v is None or v > 0),
    ("track",): ("needs wandb: pip install wandb", lambda v, a: not v or importlib.util.find_spec("wandb")),
    ("capture_video",): ("records the test env: needs --eval-interval > 0", lambda v, a: not v or a.eval_interval > 0),
}
WARNINGS = {  # legal, but almost always a mistake: one line says why, and the run goes on
    ("total_timesteps",): ("over 1% of it is not run", lambda v, a: v % (a.num_envs * a.num_steps) > v / 100),
    ("eval_interval",): ("is more than the iterations", lambda v, a: v * a.num_envs * a.num_steps > a.total_timesteps),
    ("learning_rate",): ("is far above the 1e-4 to 1e-3 that Adam is used with", lambda v, a: v > 0.01),
}


def arg_error(flag: str, rule: str, value=None):
    """One line naming the flag, its rule and its value, exit status 2: no traceback for a user's mistake."""
    value = "" if value is None else f" {value}"
    print(f"{SCRIPT}.py: error: --{flag.replace('_', '-')}{value}: {rule}", file=sys.stderr)
    sys.exit(2)


def check_args(args: Args) -> None:
    """Stop at the first flag that breaks its rule, or at sizes that do not fit in memory; then warn of odd flags."""
    for flags, (rule, ok) in RULES.items():
        for flag in flags:
            value = getattr(args, flag)
            finite = not isinstance(value, float) or np.isfinite(value)
            if not (finite and ok(value, args)):
                arg_error(flag, rule if finite else "must be a finite number", value)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    try:  # the device must work on this machine and in this torch build
        args.device = str(torch.zeros(0, device=auto if args.device == "auto" else args.device).device)
    except (RuntimeError, AssertionError, NotImplementedError) as exc:  # a bad name, no such GPU, no CUDA build
        arg_error("device", f"not usable here: {str(exc).strip().splitlines()[0][:120]}", args.device)
    batch_size = args.num_envs * args.num_steps  # as train() works it out: the checks run first
    minibatch_size = batch_size // args.num_minibatches
    # memory in bytes: the rollout (a uint8 frame, 6 numbers a step), activations (1.5 MiB a sample), games (0.3 MiB)
    need = batch_size * 12312 + (1.5 * minibatch_size + 0.3 * (args.num_envs + args.num_eval_envs)) * 2**20
    free = torch.cuda.mem_get_info(args.device)[0] if args.device.startswith("cuda") else host_memory()
    sizes = (f"num-envs {args.num_envs} x --num-steps {args.num_steps} / --num-minibatches {args.num_minibatches}, "
             f"--num-eval-envs {args.num_eval_envs}")  # fmt: skip
    what = f"need {need / 2**30:.1f} GiB on {args.device}, {free / 2**30:.1f} GiB free"
    if need > free:
        arg_error(sizes, what)
    if need > 0.75 * free:
        print(f"{SCRIPT}.py: warning: --{sizes}: {what}", file=sys.stderr)
    for flags, (why, odd) in WARNINGS.items():
        for flag in (flag for flag in flags if odd(getattr(args, flag), args)):
            print(f"{SCRIPT}.py: warning: --{flag.replace('_', '-')} {getattr(args, flag)}: {why}", file=sys.stderr)


def host_memory():
    """The host's free memory: Linux's MemAvailable, what can be taken without swapping; elsewhere unknown."""
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        return float(re.search(r"MemAvailable:\s+(\d+)", meminfo.read())[1]) * 1024
    return float("inf")


def make_dir(path: str, flag: str, new=False) -> str:
    """Create an output directory before any work starts, or stop with one line saying why it cannot be written.
    `new`: a directory no other run has, `path` or else `path_2`, `path_3`, ... (runs started in the same second)."""
    try:
        for name in (f"{path}_{n}" if n > 1 else path for n in itertools.count(1)) if new else [path]:
            with contextlib.suppress(FileExistsError if new else ()):  # taken by another run: the next name
                os.makedirs(name, exist_ok=not new)
                break
        if not os.access(name, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        arg_error(flag, f"cannot write {name}/: {exc.strerror or exc}")
    return name


def console(text):
    """Print a line; once stdout fails (a closed pipe, a full disk, a lost terminal), the rest goes nowhere."""
    try:
        print(text, flush=True)
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's last flush goes there too


if __name__ == "__main__":
    try:
        train(tyro.cli(Args))
    except BrokenPipeError:  # nothing reads the output any more: exit quietly, as command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
