# PPO: https://arxiv.org/abs/1707.06347 -- Procgen setup of PPG: https://arxiv.org/abs/2009.04416
"""Proximal Policy Optimization (PPO) on the Procgen benchmark, in one file.

The defaults are the Procgen setup of the PPG paper (starpilot, easy, 200 training levels,
25M steps, 64 envs x 256 steps, 8 minibatches, 3 epochs). Every finished training episode is
logged, and a held-out test env on the full level distribution is logged beside it.

Run it:
    python ppo_procgen.py                                    # default run, CUDA when present
    python ppo_procgen.py --env-id bigfish --seed 2          # another game and seed
    python ppo_procgen.py --eval-interval 1 --num-eval-envs 64   # evaluate on held-out levels every iteration
    python ppo_procgen.py --device cuda --capture-video      # on a GPU, with videos of the test env
    python ppo_procgen.py --total-timesteps 20000 --num-envs 8 --num-steps 64   # a quick look on a CPU
    tensorboard --logdir runs                                # read the logs
"""

import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Annotated, Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

PROCGEN_GAMES = (
    "bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball", "fruitbot",
    "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot",
)  # fmt: skip


@dataclass
class Args:
    # Experiment
    exp_name: Annotated[str, tyro.conf.arg(aliases=("--tag",))] = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment, part of the run name (rllte: `tag`)"""
    seed: int = 1
    """seed of python, numpy, torch and procgen's level generator: one seed gives one run"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
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
    save_model: bool = False
    """if toggled, save the agent's weights to `runs/{run_name}/{exp_name}.cleanrl_model` at the end"""
    tune_malloc: bool = True
    """keep glibc's freed memory for reuse instead of unmapping it (about 1.7x faster updates on CPU)"""

    # Environment
    env_id: str = "starpilot"
    """the Procgen game"""
    num_levels: int = 200
    """the number of training levels (200 for easy, 500 for hard in the Procgen paper; 0 = unlimited)"""
    start_level: int = 0
    """the first training level"""
    distribution_mode: Literal["easy", "hard", "extreme", "memory", "exploration"] = "easy"
    """the Procgen difficulty"""
    eval_interval: int = 1
    """step the held-out test env (all levels) for `num_steps` steps every this many iterations; 0 = off"""
    num_eval_envs: int = 16
    """the number of parallel test envs"""
    env_threads: int = 4
    """the number of procgen's own worker threads per vector env"""

    # Algorithm
    total_timesteps: int = 25_000_000
    """total timesteps of the experiment"""
    learning_rate: Annotated[float, tyro.conf.arg(aliases=("--lr",))] = 5e-4
    """the learning rate of the optimizer (rllte: `lr`)"""
    adam_eps: Annotated[float, tyro.conf.arg(aliases=("--eps",))] = 1e-5
    """the epsilon of Adam (rllte: `eps`)"""
    num_envs: int = 64
    """the number of parallel game environments"""
    num_steps: int = 256
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = False
    """if toggled, the learning rate decays linearly to 0 over the whole run (the PPG paper keeps it constant)"""
    gamma: Annotated[float, tyro.conf.arg(aliases=("--discount",))] = 0.999
    """the discount factor gamma (rllte: `discount`)"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches"""
    minibatch_size: Annotated[int | None, tyro.conf.arg(aliases=("--batch-size",))] = None
    """the mini-batch size; when set, it replaces `num_minibatches` (rllte: `batch_size`)"""
    update_epochs: Annotated[int, tyro.conf.arg(aliases=("--n-epochs",))] = 3
    """the K epochs to update the policy (rllte: `n_epochs`)"""
    norm_adv: bool = True
    """toggles advantages normalization (over the whole batch)"""
    clip_coef: Annotated[float, tyro.conf.arg(aliases=("--clip-range",))] = 0.2
    """the surrogate clipping coefficient (rllte: `clip_range`)"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    clip_range_vf: float | None = 0.2
    """the value clipping range, its own value (not tied to `clip_coef`); None disables value clipping"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold: the epochs of an update stop once approx_kl exceeds it"""
    norm_reward: bool = True
    """toggles reward normalisation by a running estimate of the discounted return's std"""
    clip_reward: float = 10.0
    """normalised rewards are clipped to [-clip_reward, clip_reward]"""
    feature_dim: int = 256
    """the size of the encoder's output (the dense layer after the IMPALA CNN)"""
    hidden_dim: int = 0
    """the size of a hidden layer in each head; 0 = linear heads, as in the papers"""
    init_fn: Literal["orthogonal", "xavier_uniform", "xavier_normal", "normed"] = "orthogonal"
    """the weight initialisation: orthogonal (CleanRL), xavier_* (rllte), normed (the PPG paper)"""

    # Computed at runtime
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size (computed in runtime)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of iterations (computed in runtime)"""


def check_args(args: Args) -> None:
    """Stop with one line naming the flag and its rule before any work starts; fill the computed fields."""

    def require(ok: bool, flag: str, rule: str) -> None:
        if not ok:
            print(f"{os.path.basename(sys.argv[0])}: error: --{flag}: {rule}", file=sys.stderr)
            raise SystemExit(2)

    require(args.env_id in PROCGEN_GAMES, "env-id", f"unknown game {args.env_id!r}; one of {', '.join(PROCGEN_GAMES)}")
    for flag in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "feature_dim"):
        require(getattr(args, flag) > 0, flag.replace("_", "-"), "must be positive")
    for flag in ("num_levels", "start_level", "eval_interval", "hidden_dim", "env_threads"):
        require(getattr(args, flag) >= 0, flag.replace("_", "-"), "must be >= 0")
    require(args.num_eval_envs > 0 or args.eval_interval == 0, "num-eval-envs", "must be positive")
    require(args.learning_rate > 0, "learning-rate", "must be positive")
    require(args.adam_eps > 0, "adam-eps", "must be positive")
    require(0 < args.gamma <= 1, "gamma", "must be in (0, 1]")
    require(0 <= args.gae_lambda <= 1, "gae-lambda", "must be in [0, 1]")
    require(args.clip_coef > 0, "clip-coef", "must be positive")
    require(args.clip_range_vf is None or args.clip_range_vf > 0, "clip-range-vf", "must be positive or None")
    for flag in ("ent_coef", "vf_coef"):
        require(getattr(args, flag) >= 0, flag.replace("_", "-"), "must be >= 0")
    require(args.max_grad_norm > 0, "max-grad-norm", "must be positive")
    require(args.target_kl is None or args.target_kl > 0, "target-kl", "must be positive or None")
    require(args.clip_reward > 0, "clip-reward", "must be positive")
    require(
        not args.capture_video or args.eval_interval > 0,
        "capture-video",
        "records the test env: needs --eval-interval > 0",
    )
    args.batch_size = args.num_envs * args.num_steps
    if args.minibatch_size is None:
        require(args.batch_size % args.num_minibatches == 0, "num-minibatches",
                f"must divide the batch of num_envs x num_steps = {args.batch_size}")  # fmt: skip
        args.minibatch_size = args.batch_size // args.num_minibatches
    else:
        require(0 < args.minibatch_size <= args.batch_size and args.batch_size % args.minibatch_size == 0,
                "minibatch-size", f"must divide the batch of num_envs x num_steps = {args.batch_size}")  # fmt: skip
        args.num_minibatches = args.batch_size // args.minibatch_size
    require(args.total_timesteps >= args.batch_size, "total-timesteps",
            f"must hold at least one batch of num_envs x num_steps = {args.batch_size}")  # fmt: skip
    args.num_iterations = args.total_timesteps // args.batch_size


# [1] Procgen as one gymnasium vector env: procgen steps all its envs in C, in its own threads.
class ProcgenVecEnv(gym.vector.VectorEnv):
    """Procgen's gym3 env as a `gymnasium.vector.VectorEnv`.

    Procgen restarts a finished env inside the same `step` (gymnasium's SAME_STEP autoreset): the
    observation returned with `terminated=True` is the first one of the next episode. Procgen has no
    separate time limit signal, so every episode end is a termination, as in the papers. The level
    generator is seeded once, when the env is built ([2]); `reset` does not re-seed it.
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "render_fps": 15}

    def __init__(self, env_id, num_envs, num_levels, start_level, distribution_mode, seed, num_threads, video_dir=None):
        import contextlib
        import io

        with contextlib.redirect_stderr(io.StringIO()):  # the old `gym` that procgen imports prints a notice
            from procgen import ProcgenGym3Env

        # [2] Seeded level generator: `rand_seed` fixes which levels each env plays and in what order.
        self.env = ProcgenGym3Env(
            num=num_envs, env_name=env_id, num_levels=num_levels, start_level=start_level,
            distribution_mode=distribution_mode, rand_seed=seed, num_threads=num_threads,
        )  # fmt: skip
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
        self.single_action_space = gym.spaces.Discrete(15)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.video_dir, self.video_episode, self.frames = video_dir, 0, []

    def reset(self, *, seed=None, options=None):
        _, obs, _ = self.env.observe()
        self.frames = [obs["rgb"][0]]
        return obs["rgb"], {}

    def step(self, actions):
        self.env.act(np.asarray(actions, dtype=np.int32))
        reward, obs, first = self.env.observe()
        if self.video_dir is not None:
            self._record(obs["rgb"][0], first[0])
        return obs["rgb"], reward, first, np.zeros_like(first), {}

    def _record(self, frame, episode_ended):
        """Keep the frames of env 0 and write episodes 0, 1, 8, 27, ... as mp4 files."""
        if episode_ended:
            if round(self.video_episode ** (1 / 3)) ** 3 == self.video_episode:
                import imageio_ffmpeg

                os.makedirs(self.video_dir, exist_ok=True)
                path = os.path.join(self.video_dir, f"episode-{self.video_episode}.mp4")
                writer = imageio_ffmpeg.write_frames(path, (64, 64), fps=15, macro_block_size=1)
                writer.send(None)
                for f in self.frames:
                    writer.send(np.ascontiguousarray(f))
                writer.close()
            self.video_episode += 1
            self.frames = []
        self.frames.append(frame)


# [18] Speed only: the allocator setting changes no result.
def tune_malloc():
    """Stop glibc from mapping and unmapping the large activation buffers of every minibatch.

    By default glibc serves blocks above 32 MiB with fresh `mmap`s and gives them back on `free`, so
    every forward and backward pass page-faults gigabytes of zeroed memory, and threads keep arenas
    that are trimmed the same way. Serving everything from one heap that is never trimmed removes
    that system time. It must run before torch's worker threads first allocate.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX: no fresh mmap per large block
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: never give the heap's top back
        libc.mallopt(-8, 1)  # M_ARENA_MAX: one arena, so worker threads reuse the same heap
    except (OSError, AttributeError):
        pass  # not glibc (macOS, musl): nothing to tune


def make_env(args: Args, num_envs: int, num_levels: int, start_level: int, seed: int, train: bool, video_dir=None):
    envs = ProcgenVecEnv(
        args.env_id, num_envs, num_levels, start_level, args.distribution_mode, seed, args.env_threads, video_dir
    )
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    if train and args.norm_reward:
        # [5] Reward scaling by the std of the discounted return, with the training discount, then clipping.
        envs = gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma)
        envs = gym.wrappers.vector.ClipReward(envs, -args.clip_reward, args.clip_reward)
    return envs


# [7] Initialisation. For orthogonal and normed init, `std` is the L2 norm of each output unit's
# weights (orthogonal rows have norm `gain`); for xavier it is the gain.
def layer_init(layer, std=np.sqrt(2), init_fn="orthogonal", bias_const=0.0):
    if init_fn == "orthogonal":
        torch.nn.init.orthogonal_(layer.weight, std)
    elif init_fn == "xavier_uniform":
        torch.nn.init.xavier_uniform_(layer.weight, std)
    elif init_fn == "xavier_normal":
        torch.nn.init.xavier_normal_(layer.weight, std)
    else:  # "normed": the PPG paper's scheme, Gaussian weights rescaled per output unit
        with torch.no_grad():
            layer.weight.normal_()
            layer.weight.mul_(std / layer.weight.flatten(1).norm(dim=1).view(-1, *[1] * (layer.weight.dim() - 1)))
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


# [6] IMPALA CNN (Espeholt et al., 2018): three stacks of conv, max-pool and two residual blocks.
class ResidualBlock(nn.Module):
    def __init__(self, channels, std, init_fn):
        super().__init__()
        self.conv0 = layer_init(nn.Conv2d(channels, channels, kernel_size=3, padding=1), std, init_fn)
        self.conv1 = layer_init(nn.Conv2d(channels, channels, kernel_size=3, padding=1), std, init_fn)

    def forward(self, x):
        inputs = x
        x = nn.functional.relu(x)
        x = self.conv0(x)
        x = nn.functional.relu(x)
        x = self.conv1(x)
        return x + inputs


class ConvSequence(nn.Module):
    def __init__(self, input_shape, out_channels, scale, init_fn):
        super().__init__()
        self._input_shape = input_shape
        self._out_channels = out_channels
        self.conv = layer_init(nn.Conv2d(input_shape[0], out_channels, kernel_size=3, padding=1), 1.0, init_fn)
        # the two residual branches of a stack add up to `scale`, so activations keep their size with depth
        block_std = np.sqrt(scale / np.sqrt(2))
        self.res_block0 = ResidualBlock(out_channels, block_std, init_fn)
        self.res_block1 = ResidualBlock(out_channels, block_std, init_fn)

    def forward(self, x):
        x = self.conv(x)
        x = nn.functional.max_pool2d(x, kernel_size=3, stride=2, padding=1)
        x = self.res_block0(x)
        x = self.res_block1(x)
        return x

    def get_output_shape(self):
        _c, h, w = self._input_shape
        return (self._out_channels, (h + 1) // 2, (w + 1) // 2)


def impala_cnn(feature_dim, init_fn):
    shape, conv_seqs = (3, 64, 64), []
    for out_channels in [16, 32, 32]:
        conv_seq = ConvSequence(shape, out_channels, 1 / np.sqrt(3), init_fn)
        shape = conv_seq.get_output_shape()
        conv_seqs.append(conv_seq)
    conv_seqs += [
        nn.Flatten(),
        nn.ReLU(),
        layer_init(nn.Linear(shape[0] * shape[1] * shape[2], feature_dim), np.sqrt(2), init_fn),
        nn.ReLU(),
    ]
    return nn.Sequential(*conv_seqs)


def head(feature_dim, hidden_dim, out_dim, std, init_fn):
    if hidden_dim == 0:
        return layer_init(nn.Linear(feature_dim, out_dim), std, init_fn)
    return nn.Sequential(
        layer_init(nn.Linear(feature_dim, hidden_dim), np.sqrt(2), init_fn),
        nn.ReLU(),
        layer_init(nn.Linear(hidden_dim, out_dim), std, init_fn),
    )


class Agent(nn.Module):
    def __init__(self, args: Args, num_actions: int):
        super().__init__()
        self.network = impala_cnn(args.feature_dim, args.init_fn)
        # [7] Near-uniform initial policy, small initial value: heads 0.01 and 1 (CleanRL), both 0.1 (PPG paper).
        actor_std, critic_std = (0.1, 0.1) if args.init_fn == "normed" else (0.01, 1.0)
        self.actor = head(args.feature_dim, args.hidden_dim, num_actions, actor_std, args.init_fn)
        self.critic = head(args.feature_dim, args.hidden_dim, 1, critic_std, args.init_fn)

    def get_value(self, x):
        x = x.permute((0, 3, 1, 2)) / 255.0  # "bhwc" -> "bchw", uint8 -> [0, 1]
        hidden = self.network(x)
        return self.critic(hidden)

    def get_action_and_value(self, x, action=None):
        x = x.permute((0, 3, 1, 2)) / 255.0  # "bhwc" -> "bchw", uint8 -> [0, 1]
        hidden = self.network(x)
        logits = self.actor(hidden)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


# [10] Generalized Advantage Estimation (Schulman et al., 2016).
def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Advantages and returns of a rollout, all tensors (num_steps, num_envs).

    `dones[t]` is 1 when `obs[t]` starts a new episode (the step before it ended one); `next_value`
    and `next_done` belong to the observation after the last step and bootstrap the tail.
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, advantages + values


# [13] The clipped surrogate objective, as a loss to minimise.
def clipped_policy_loss(logratio, advantages, clip_coef):
    ratio = logratio.exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    return torch.max(pg_loss1, pg_loss2).mean()


# [14] Value loss, clipped around the rollout's values by its own range (None: plain squared error).
def clipped_value_loss(newvalue, oldvalue, returns, clip_range_vf):
    v_loss_unclipped = (newvalue - returns) ** 2
    if clip_range_vf is None:
        return 0.5 * v_loss_unclipped.mean()
    v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_range_vf, clip_range_vf)
    v_loss_clipped = (v_clipped - returns) ** 2
    return 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()


# [12] Minibatches: a fresh shuffle of the whole batch every epoch.
def minibatch_indices(batch_size, minibatch_size):
    b_inds = np.random.permutation(batch_size)
    return [b_inds[start : start + minibatch_size] for start in range(0, batch_size, minibatch_size)]


def log_episodes(writer, infos, global_step, tag, recent_returns):
    """[4] Log every episode that ended in a step, not only the first."""
    if "episode" not in infos:
        return
    for r, l in zip(infos["episode"]["r"][infos["_episode"]], infos["episode"]["l"][infos["_episode"]], strict=True):
        writer.add_scalar(f"charts/{tag}episodic_return", r, global_step)
        writer.add_scalar(f"charts/{tag}episodic_length", l, global_step)
        recent_returns.append(float(r))


def train(args: Args):
    check_args(args)
    if args.tune_malloc:
        tune_malloc()
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
            config=vars(args), name=run_name, monitor_gym=True, save_code=True,
        )  # fmt: skip
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()),
    )

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = (
        torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if args.device == "auto"
        else torch.device(args.device)
    )

    # env setup: [3] training levels [start_level, start_level + num_levels), test on all levels
    envs = make_env(args, args.num_envs, args.num_levels, args.start_level, args.seed, train=True)
    if args.eval_interval > 0:
        video_dir = f"videos/{run_name}" if args.capture_video else None
        test_envs = make_env(args, args.num_eval_envs, 0, 0, args.seed + 1_000_003, train=False, video_dir=video_dir)
        test_obs = torch.as_tensor(test_envs.reset()[0], device=device)

    agent = Agent(args, envs.single_action_space.n).to(device)
    # [8] Adam with epsilon 1e-5 rather than PyTorch's 1e-8, as in the reference PPO code.
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)

    # ALGO Logic: Storage setup; observations stay uint8 until the network converts them
    obs = torch.zeros((args.num_steps, args.num_envs, 64, 64, 3), dtype=torch.uint8).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    start_time = time.time()
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs, device=device)
    next_done = torch.zeros(args.num_envs).to(device)
    recent_returns, recent_test_returns = deque(maxlen=100), deque(maxlen=100)

    for iteration in range(1, args.num_iterations + 1):
        iteration_start = time.time()
        # [9] Learning-rate annealing over the whole run, when on.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            rewards[step] = torch.as_tensor(reward, device=device).view(-1)
            next_obs = torch.as_tensor(next_obs, device=device)
            next_done = torch.as_tensor(np.logical_or(terminations, truncations), device=device, dtype=torch.float32)
            log_episodes(writer, infos, global_step, "", recent_returns)

        # [3] Held-out evaluation: the same stochastic policy on levels it never trains on.
        if args.eval_interval > 0 and iteration % args.eval_interval == 0:
            for _ in range(args.num_steps):
                with torch.no_grad():
                    test_action = agent.get_action_and_value(test_obs)[0]
                test_obs, _, _, _, test_infos = test_envs.step(test_action.cpu().numpy())
                test_obs = torch.as_tensor(test_obs, device=device)
                log_episodes(writer, test_infos, global_step, "test_", recent_test_returns)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages, returns = compute_gae(
                rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda
            )

        # flatten the batch
        b_obs = obs.reshape((-1, 64, 64, 3))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)
        # [11] Advantage normalisation over the whole batch (OpenAI's PPG code), not per minibatch as in CleanRL.
        if args.norm_adv:
            b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)

        # Optimizing the policy and value network
        clipfracs = []
        for _epoch in range(args.update_epochs):
            for mb_inds in minibatch_indices(args.batch_size, args.minibatch_size):
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                pg_loss = clipped_policy_loss(logratio, b_advantages[mb_inds], args.clip_coef)
                v_clip = args.clip_range_vf if args.clip_vloss else None
                v_loss = clipped_value_loss(newvalue.view(-1), b_values[mb_inds], b_returns[mb_inds], v_clip)
                entropy_loss = entropy.mean()  # [15] entropy bonus, keeps exploring
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                # [16] Global gradient-norm clipping.
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            # [17] Early stop of the epochs once the policy moved too far, when `target_kl` is set.
            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
        writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
        writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
        writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
        writer.add_scalar("losses/clipfrac", np.mean(clipfracs), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        sps = int(global_step / (time.time() - start_time))
        writer.add_scalar("charts/SPS", sps, global_step)
        print(
            f"iter {iteration}/{args.num_iterations}  step {global_step}  SPS {sps}  "
            f"({time.time() - iteration_start:.1f}s/iter)  return {np.mean(recent_returns or [np.nan]):.2f}  "
            f"test {np.mean(recent_test_returns or [np.nan]):.2f}",
            flush=True,
        )

    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        torch.save(agent.state_dict(), model_path)
        print(f"model saved to {model_path}")

    envs.close()
    if args.eval_interval > 0:
        test_envs.close()
    writer.close()
    return run_name


if __name__ == "__main__":
    train(tyro.cli(Args))
