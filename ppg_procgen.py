# PPG: https://arxiv.org/abs/2009.04416 -- built on PPO: https://arxiv.org/abs/1707.06347
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
"""PPG on Procgen: phases of 32 PPO iterations, then 6 auxiliary epochs, on the Procgen paper's easy
setup; ppg_procgen_full.py adds checkpoints, torchrun, RND, V-trace and more. On a CPU:
python ppg_procgen.py --total-timesteps 8192 --n-iteration 4 --num-envs 16 --num-steps 64 --e-auxiliary 1"""

import contextlib
import ctypes
import io
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

with contextlib.redirect_stderr(io.StringIO()):  # procgen's old `gym` prints a notice
    try:
        from procgen import ProcgenGym3Env as Procgen  # procgen, procgen-mirror (Python 3.10-3.12)
    except ImportError:
        from procgen_gym import ProcgenVecEnv as Procgen  # procgen-gym (3.13): the same games

SCRIPT = os.path.basename(__file__)[: -len(".py")]
PROCGEN_GAMES = "bigfish bossfight caveflyer chaser climber coinrun dodgeball fruitbot".split()
PROCGEN_GAMES += "heist jumper leaper maze miner ninja plunder starpilot".split()
MODE_GAMES = {  # the games of each other mode (easy, hard: all)
    "extreme": "chaser dodgeball leaper starpilot",
    "memory": "caveflyer dodgeball heist jumper maze miner",
    "exploration": "caveflyer climber coinrun heist jumper leaper maze ninja",
}


@dataclass
class Args:
    exp_name: str = SCRIPT
    """the name of this experiment, part of the run name"""
    seed: int = 1
    """seed of python, numpy, torch and procgen's levels"""
    torch_deterministic: bool = True
    """if toggled, deterministic cuDNN: a GPU run repeats itself"""
    device: str = "auto"
    """`auto` (CUDA if available, else CPU), `cpu`, `cuda` or `cuda:N`"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "procgen"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    env_id: str = "starpilot"
    """the Procgen game"""
    num_levels: int = 200
    """the number of training levels (0: all)"""
    start_level: int = 0
    """the first training level"""
    distribution_mode: Literal["easy", "hard", "extreme", "memory", "exploration"] = "easy"
    """the Procgen difficulty (exploration: one fixed level)"""
    eval_interval: int = 1
    """test every this many iterations (0: never)"""
    num_eval_envs: int = 16
    """the number of parallel test envs"""
    total_timesteps: int = 25_000_000
    """total timesteps of the experiment"""
    learning_rate: float = 5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 64
    """the number of parallel game environments"""
    num_steps: int = 256
    """the steps of each env in a rollout"""
    anneal_lr: bool = False
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.999
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches"""
    norm_adv: bool = True
    """toggles advantages normalization (over the whole batch)"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_range_vf: float | None = 0.2
    """the value clipping range; None: no value clipping"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold"""
    norm_reward: bool = True
    """toggles reward normalisation"""
    clip_reward: float = 10.0
    """the clip of normalised rewards"""
    feature_dim: int = 256
    """the size of the IMPALA CNN's dense layer"""
    init_fn: Literal["orthogonal", "torch_default", "tf_default", "normed"] = "normed"
    """the initialisation (`layer_init`)"""
    save_model: bool = False
    """whether to save model into the `runs/{run_name}` folder"""

    # PPG
    arch: Literal["dual", "shared", "detach"] = "dual"
    """dual: separate policy and value networks (the paper's); shared: one network; detach: one
    network, the value head reads detached features (CleanRL's)"""
    n_iteration: int = 32
    """N_pi, the policy iterations of a phase"""
    e_policy: int = 1
    """E_pi, the policy epochs of each policy iteration"""
    v_value: int = 1
    """E_V, the value epochs of each policy iteration (in the same passes as E_pi)"""
    e_auxiliary: int = 6
    """E_aux, the auxiliary epochs of a phase"""
    beta_clone: float = 1.0
    """the weight of the behaviour-cloning KL in the auxiliary loss"""
    num_aux_rollouts: int = 4
    """the whole env rollouts in one auxiliary minibatch"""
    n_aux_grad_accum: int = 1
    """the auxiliary minibatches whose gradients add up to one optimizer step"""


class ProcgenVecEnv(gym.vector.VectorEnv):
    """[1] Procgen as a vector env; a finished env restarts in the same `step`."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, num_envs, seed, **procgen_kwargs):
        if procgen_kwargs["distribution_mode"] == "exploration":  # one level, procgen's
            del procgen_kwargs["num_levels"], procgen_kwargs["start_level"]
        # [2] Seeded level generator: which levels each env plays, in order
        self.env = Procgen(num=num_envs, rand_seed=seed, **procgen_kwargs)
        self.num_envs, self.gym3 = num_envs, hasattr(self.env, "act")  # else procgen-gym's
        self.single_observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
        self.single_action_space = gym.spaces.Discrete(15)  # in every game
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed=None, options=None):
        return self.env.observe()[1]["rgb"] if self.gym3 else self.env.reset()[0], {}

    def step(self, actions):
        if self.gym3:
            self.env.act(np.asarray(actions, dtype=np.int32))
            reward, obs, first = self.env.observe()
            obs = obs["rgb"]
        else:  # procgen-gym's "terminated" is procgen's `first`
            obs, reward, first, _, _ = self.env.step(np.asarray(actions, dtype=np.int32))
        return obs, reward, first, np.zeros_like(first), {}


def make_envs(num_envs, seed, num_levels, start_level, args: Args):
    """`num_envs` games on `num_levels` levels from `start_level` (0: all)."""
    kwargs = dict(num_levels=num_levels, start_level=start_level, env_name=args.env_id)
    envs = ProcgenVecEnv(num_envs, seed, distribution_mode=args.distribution_mode, **kwargs)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP  # as `dones` needs
    return envs


# [3] Initialisation: `std` is the norm of each output unit's weights
def layer_init(layer, std=np.sqrt(2), init_fn="orthogonal", bias_const=0.0):
    if init_fn == "orthogonal":
        torch.nn.init.orthogonal_(layer.weight, std)
    elif init_fn == "tf_default":  # glorot-uniform, gain 1
        torch.nn.init.xavier_uniform_(layer.weight)
    elif init_fn == "normed":  # Gaussian, rescaled per output unit
        with torch.no_grad():
            layer.weight.normal_()
            layer.weight.mul_(std / layer.weight.flatten(1).norm(dim=1).view(-1, *[1] * (layer.weight.dim() - 1)))
    if init_fn != "torch_default":  # else PyTorch's own init
        torch.nn.init.constant_(layer.bias, bias_const)
    return layer


# [4] IMPALA CNN (Espeholt et al., 2018): stacks of conv, max-pool and two residual blocks.
class ResidualBlock(nn.Module):
    def __init__(self, channels, std, init_fn):
        super().__init__()
        self.conv0 = layer_init(nn.Conv2d(channels, channels, 3, padding=1), std, init_fn)
        self.conv1 = layer_init(nn.Conv2d(channels, channels, 3, padding=1), std, init_fn)

    def forward(self, x):
        return x + self.conv1(nn.functional.relu(self.conv0(nn.functional.relu(x))))


def impala_cnn(obs_shape, feature_dim, init_fn, stacks=(16, 32, 32)):
    """64x64x3 -> 32x32x16 -> 16x16x32 -> 8x8x32 -> 256. Each of n residual branches has a gain of
    1/sqrt(n), each conv its square root (OpenAI's PPG code)."""
    (height, width, channels), layers = obs_shape, []
    block_std = np.sqrt(1 / np.sqrt(len(stacks)) / np.sqrt(2))  # 2 blocks per stack
    for out_channels in stacks:
        conv = layer_init(nn.Conv2d(channels, out_channels, kernel_size=3, padding=1), 1.0, init_fn)
        blocks = [ResidualBlock(out_channels, block_std, init_fn) for _ in range(2)]
        layers += [conv, nn.MaxPool2d(kernel_size=3, stride=2, padding=1), *blocks]
        channels, height, width = out_channels, (height + 1) // 2, (width + 1) // 2  # pooled
    dense = layer_init(nn.Linear(channels * height * width, feature_dim), np.sqrt(2), init_fn)
    return nn.Sequential(*layers, nn.Flatten(), nn.ReLU(), dense, nn.ReLU())


def preprocess(x):
    return x.permute((0, 3, 1, 2)) / 255.0  # "bhwc" -> "bchw", uint8 -> [0, 1]


class Agent(nn.Module):
    def __init__(self, obs_shape, num_actions, feature_dim, init_fn, arch):
        super().__init__()
        self.network = impala_cnn(obs_shape, feature_dim, init_fn)
        # [3] Heads: policy 0.01 (near-uniform first actions), value 1 (normed: both 0.1)
        actor_std, critic_std = (0.1, 0.1) if init_fn == "normed" else (0.01, 1.0)
        head_fn = "orthogonal" if init_fn.endswith("_default") else init_fn
        self.actor = layer_init(nn.Linear(feature_dim, num_actions), actor_std, head_fn)
        self.critic = layer_init(nn.Linear(feature_dim, 1), critic_std, head_fn)
        # [19] The PPG architectures: what the true value head reads, and what its loss trains
        self.arch = arch
        if arch == "dual":
            self.value_network = impala_cnn(obs_shape, feature_dim, init_fn)
        # [20] The auxiliary value head on the policy's features: the value distilled into them
        self.aux_critic = layer_init(nn.Linear(feature_dim, 1), critic_std, head_fn)

    def value_hidden(self, x, hidden):
        """The critic's input: its own network (dual), or the policy's features."""
        if self.arch == "dual":
            return self.value_network(x)
        return hidden.detach() if self.arch == "detach" else hidden

    def get_value(self, x):
        x = preprocess(x)
        return self.critic(self.value_network(x) if self.arch == "dual" else self.network(x))

    def get_action_and_value(self, x, action=None):
        x = preprocess(x)
        hidden = self.network(x)
        probs = Categorical(logits=self.actor(hidden), validate_args=False)  # no GPU wait
        if action is None:
            action = probs.sample()
        value = self.critic(self.value_hidden(x, hidden))
        return action, probs.log_prob(action), probs.entropy(), value

    def get_pi(self, x):
        """The policy's logits alone (the old policy of the auxiliary phase)."""
        return self.actor(self.network(preprocess(x)))

    def get_pi_value_and_aux_value(self, x):
        x = preprocess(x)
        hidden = self.network(x)
        value = self.critic(self.value_hidden(x, hidden))
        pi = Categorical(logits=self.actor(hidden), validate_args=False)
        return pi, value, self.aux_critic(hidden)


# The loop's three stages (as LeanRL cuts its): the policy step, the advantages (`compute_gae`)
# and one update minibatch; none waits for the GPU.
def policy_step(agent, next_obs):
    """Observation in; the sampled action, its log-probability and the value out."""
    with torch.no_grad():
        action, logprob, _, value = agent.get_action_and_value(next_obs)
    return action, logprob, value.flatten()


# [5] GAE (Schulman et al. 2016), (num_steps, num_envs): dones[t] = 1 if obs[t] starts an episode
def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    nextvalues = torch.cat([values[1:], next_value.view(1, -1)])  # the value after each step
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


# [7] Value loss per sample: 0.5 max(clipped, unclipped), as in PPO2 and CleanRL
def clipped_value_loss(newvalue, oldvalue, returns, clip_range_vf):
    v_loss_unclipped = (newvalue - returns) ** 2
    if clip_range_vf is None:
        return 0.5 * v_loss_unclipped
    v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_range_vf, clip_range_vf)
    return 0.5 * torch.max(v_loss_unclipped, (v_clipped - returns) ** 2)


# [8] Minibatches: a fresh shuffle of the batch every epoch, sent to the device once an epoch.
def minibatch_indices(batch_size, minibatch_size, device):
    b_inds = torch.as_tensor(np.random.permutation(batch_size), device=device)
    return b_inds.split(minibatch_size)


# [21] Behaviour cloning term of the auxiliary phase: KL(old policy || new policy).
def policy_kl(old_logits, new_logits):
    old, new = (Categorical(logits=logits, validate_args=False) for logits in (old_logits, new_logits))
    return torch.distributions.kl_divergence(old, new).mean()


# [22] The auxiliary phase: distil the value into the policy network while cloning the old policy.
def auxiliary_phase(agent, optimizer, aux_obs, aux_returns, args: Args):
    """E_aux epochs over the phase buffer (num_steps x rollouts), `num_aux_rollouts` whole
    rollouts a minibatch (the last may have fewer); returns the mean of each statistic."""
    num_rollouts, mb_rollouts = aux_obs.shape[1], args.num_aux_rollouts
    # the old policy: its logits for the whole buffer, before any auxiliary step
    with torch.no_grad():
        chunks = [aux_obs[:, i : i + mb_rollouts] for i in range(0, num_rollouts, mb_rollouts)]
        logits = [agent.get_pi(c.flatten(0, 1)).unflatten(0, c.shape[:2]) for c in chunks]
        aux_logits = torch.cat(logits, dim=1)
    stats = {}  # each statistic's values, by name
    optimizer.zero_grad()
    for _epoch in range(args.e_auxiliary):
        for i, mb_inds in enumerate(minibatch_indices(num_rollouts, mb_rollouts, aux_obs.device)):
            step = (i + 1) % args.n_aux_grad_accum == 0  # n_aux_grad_accum minibatches add up
            mb = [x[:, mb_inds].flatten(0, 1) for x in (aux_obs, aux_returns, aux_logits)]
            for name, value in aux_minibatch(agent, optimizer, mb, step, args).items():
                stats.setdefault(name, []).append(value)
    means = torch.stack([torch.stack(values).mean() for values in stats.values()]).tolist()
    return dict(zip(stats, means, strict=True))


def aux_minibatch(agent, optimizer, mb, step, args: Args):
    """One auxiliary minibatch's backward; with `step`, clipping, the step and zeroed gradients."""
    m_obs, m_returns, m_logits = mb
    new_pi, new_value, new_aux_value = agent.get_pi_value_and_aux_value(m_obs)
    kl_loss = policy_kl(m_logits, new_pi.logits)
    aux_value_loss = 0.5 * ((new_aux_value.view(-1) - m_returns) ** 2).mean()
    real_value_loss = 0.5 * ((new_value.view(-1) - m_returns) ** 2).mean()
    loss = aux_value_loss + args.beta_clone * kl_loss + real_value_loss
    (loss / args.n_aux_grad_accum).backward()
    if step:
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
    stats = dict(kl_loss=kl_loss, aux_value_loss=aux_value_loss, real_value_loss=real_value_loss)
    return {name: value.detach() for name, value in stats.items()}


def update_minibatch(agent, optimizer, mb, epoch, args: Args):
    """One minibatch's step; the `stats` (on the device) are logged by name."""
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
    entropy_loss = entropy.mean()  # [9] entropy bonus, keeps exploring
    # [23] E_pi and E_V epochs share their passes; past E_pi (or E_V) that loss is left out: what
    # only it reaches gets no gradient (None), and Adam leaves it be
    loss = torch.zeros((), device=mb_values.device)
    if epoch < args.e_policy:
        loss = loss + pg_loss - args.ent_coef * entropy_loss
    if epoch < args.v_value:
        loss = loss + v_loss * args.vf_coef
    stats = dict(value_loss=v_loss, policy_loss=pg_loss, entropy=entropy_loss, approx_kl=approx_kl)
    stats |= dict(old_approx_kl=old_approx_kl, clipfrac=clipfrac)
    optimizer.zero_grad()
    loss.backward()
    # [10] Global gradient-norm clipping, as in CleanRL (OpenAI's PPG code does not clip).
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return {name: value.detach() for name, value in stats.items()}


def log_episodes(episodes, infos, global_step, tag):
    """[11] Keep every episode that ended in a step, not only the first."""
    for i in np.flatnonzero(infos.get("_episode", [])):
        episodes.append((tag, global_step, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))


def train(args: Args):
    check_args(args)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_phases = args.total_timesteps // (args.batch_size * args.n_iteration)
    args.num_iterations = args.num_phases * args.n_iteration
    tune_allocator()  # [12] speed only
    device = torch.device(args.device)
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if args.track:
        import wandb

        kwargs = dict(project=args.wandb_project_name, entity=args.wandb_entity, name=run_name)
        wandb.init(**kwargs, sync_tensorboard=True, config=vars(args), monitor_gym=True, save_code=True)
    writer = SummaryWriter(f"runs/{run_name}")
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.benchmark = not args.torch_deterministic

    # env setup: [13] the training levels; test envs on all levels
    envs = make_envs(args.num_envs, args.seed, args.num_levels, args.start_level, args)
    if args.norm_reward:  # [14] divided by the discounted return's std, clipped
        envs = gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma)
        envs = gym.wrappers.vector.TransformReward(envs, lambda r: np.clip(r, -args.clip_reward, args.clip_reward))
    if args.eval_interval > 0:
        test_envs = make_envs(args.num_eval_envs, args.seed + 1_000_003, 0, 0, args)
        test_obs = torch.as_tensor(test_envs.reset()[0], device=device)

    num_actions, arch = envs.single_action_space.n, args.arch
    agent = Agent(envs.single_observation_space.shape, num_actions, args.feature_dim, args.init_fn, arch)
    agent = agent.to(device, memory_format=torch.channels_last)  # NHWC, as the frames
    # [15] Adam epsilon 1e-5 as in PPO2 and CleanRL (OpenAI's PPG code: 1e-8)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # ALGO Logic: Storage setup; observations stay uint8
    obs = torch.zeros((args.num_steps, *envs.observation_space.shape), dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, envs.num_envs), dtype=torch.long, device=device)
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, envs.num_envs), device=device) for _ in range(4))
    # [24] The phase buffer: every observation of a phase, as uint8, for the auxiliary phase
    aux_shape = (args.num_steps, envs.num_envs * args.n_iteration)
    aux_obs = torch.zeros((*aux_shape, 64, 64, 3), dtype=torch.uint8, device=device)
    aux_returns = torch.zeros(aux_shape, device=device)

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    next_obs = torch.as_tensor(envs.reset()[0], device=device)
    next_done = torch.zeros(envs.num_envs, device=device)
    recent_returns, recent_test_returns, start_time = deque(maxlen=100), deque(maxlen=100), time.time()

    for iteration in range(1, args.num_iterations + 1):
        episodes = []
        if args.anneal_lr:  # [16] over the whole run
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

        if args.eval_interval > 0 and iteration % args.eval_interval == 0:  # [13] the same policy
            # test actions from their own generator: training's draws stay the same
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
        # [17] Advantages normalised over the batch (OpenAI's PPG code), not per minibatch (CleanRL)
        if args.norm_adv:
            b_mean, b_std = b_advantages.mean(), b_advantages.std()
            b_advantages = (b_advantages - b_mean) / (b_std + 1e-8)
        # [24] The rollout, kept for the auxiliary phase in this iteration's slot of the phase
        slot = (iteration - 1) % args.n_iteration * envs.num_envs
        aux_obs[:, slot : slot + envs.num_envs] = obs
        aux_returns[:, slot : slot + envs.num_envs] = returns

        # Optimizing the policy and value network
        clipfracs, batch = [], (b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values)
        for epoch in range(max(args.e_policy, args.v_value)):
            for mb_inds in minibatch_indices(args.batch_size, args.minibatch_size, device):
                stats = update_minibatch(agent, optimizer, [x[mb_inds] for x in batch], epoch, args)
                clipfracs.append(stats["clipfrac"])

            # [18] Early stop once the policy moved too far
            if args.target_kl is not None and stats["approx_kl"].item() > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        stats["clipfrac"] = torch.stack(clipfracs).mean()  # the rest: the last minibatch's
        read = torch.stack(list(stats.values())).tolist()  # one read from the device
        logged = {f"losses/{name}": value for name, value in zip(stats, read, strict=True)}
        logged["losses/explained_variance"] = explained_var
        logged["charts/learning_rate"] = optimizer.param_groups[0]["lr"]
        for tag, value in logged.items():
            writer.add_scalar(tag, value, global_step)
        for tag, step, r, l in episodes:
            writer.add_scalar(f"charts/{tag}episodic_return", r, step)
            writer.add_scalar(f"charts/{tag}episodic_length", l, step)
            (recent_test_returns if tag else recent_returns).append(r)
        sps = global_step / (time.time() - start_time)
        writer.add_scalar("charts/SPS", int(sps), global_step)
        writer.flush()  # on disk before the console line
        means = [np.mean(r or [np.nan]) for r in (recent_returns, recent_test_returns)]
        line = f"iter {iteration}/{args.num_iterations}  step {global_step}  SPS {int(sps)}"
        print(f"{line}  return {means[0]:.2f}  test {means[1]:.2f}", flush=True)

        # [22] The auxiliary phase closes each phase of n_iteration policy iterations.
        if iteration % args.n_iteration == 0:
            aux_stats = auxiliary_phase(agent, optimizer, aux_obs, aux_returns, args)
            for name, value in aux_stats.items():
                writer.add_scalar(f"losses/aux/{name}", value, global_step)
            losses = "  ".join(f"{name} {value:.4f}" for name, value in aux_stats.items())
            print(f"phase {iteration // args.n_iteration}/{args.num_phases}  {losses}", flush=True)

    envs.close()
    if args.eval_interval > 0:
        test_envs.close()
    writer.close()
    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        torch.save(agent.state_dict(), model_path)
        print(f"model saved to {model_path}")
    return run_name


def tune_allocator():
    """[12] One glibc heap, never trimmed: big buffers reused, not mapped anew (2x on a CPU)"""
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        for option, value in ((-4, 0), (-1, 2**31 - 1), (-8, 1)):  # M_MMAP_MAX, M_TRIM_THRESHOLD, M_ARENA_MAX
            ctypes.CDLL("libc.so.6").mallopt(option, value)


def check_args(args: Args):
    """The common mistakes, each in one line (tyro rejects a wrong type)."""
    batch, sizes = args.num_envs * args.num_steps, ("num_envs", "num_steps", "num_eval_envs")
    games = MODE_GAMES.get(args.distribution_mode, args.env_id).split()
    divides = args.num_minibatches >= 1 and batch % args.num_minibatches == 0
    phase, sizes = batch * args.n_iteration, sizes + ("n_iteration", "num_aux_rollouts", "n_aux_grad_accum")
    # [22] as CleanRL's, the last auxiliary minibatch may hold fewer rollouts; a step closes whole groups
    aux_mbs = -(-args.num_envs * args.n_iteration // max(args.num_aux_rollouts, 1))
    for flag, ok, rule in [
        ("env_id", args.env_id in PROCGEN_GAMES, f"must be one of {', '.join(PROCGEN_GAMES)}"),
        ("distribution_mode", args.env_id in games, "is not made for this game"),
        *((flag, getattr(args, flag) >= 1, "must be at least 1") for flag in sizes),
        ("total_timesteps", args.total_timesteps >= phase, "must hold a phase: a batch x --n-iteration"),
        ("num_minibatches", divides, "must divide --num-envs x --num-steps"),
        ("n_aux_grad_accum", aux_mbs % max(args.n_aux_grad_accum, 1) == 0, f"must divide {aux_mbs} minibatches"),
    ]:
        if not ok:
            stop(flag, getattr(args, flag), rule)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        args.device = str(torch.zeros(0, device=args.device.replace("auto", auto)).device)
    except (RuntimeError, AssertionError) as exc:  # no such GPU, no CUDA
        stop("device", args.device, str(exc).splitlines()[0])


def stop(flag, value, rule):
    """Exit status 2, as tyro's errors."""
    print(f"{SCRIPT}.py: error: --{flag.replace('_', '-')} {value}: {rule}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    train(tyro.cli(Args))
