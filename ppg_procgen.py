# PPG: https://arxiv.org/abs/2009.04416 -- built on PPO: https://arxiv.org/abs/1707.06347
"""Phasic Policy Gradient (PPG) on the Procgen benchmark, in one file: ppo_procgen.py plus the auxiliary phase.

The defaults are the PPG paper's Procgen setup (starpilot, easy, 200 training levels, 25M steps,
64 envs x 256 steps, 8 minibatches; phases of 32 policy iterations, then 6 auxiliary epochs; separate
policy and value networks). Every finished training episode is logged, and a held-out test env on
the full level distribution is logged beside it.

Run it:
    python ppg_procgen.py                                    # default run, CUDA when present
    python ppg_procgen.py --arch detach --init-fn orthogonal # CleanRL's single-network variant
    python ppg_procgen.py --eval-interval 1 --num-eval-envs 64   # evaluate on held-out levels every iteration
    python ppg_procgen.py --device cuda --capture-video      # on a GPU, with videos of the test env
    python ppg_procgen.py --total-timesteps 32768 --n-iteration 2 --num-envs 16 --num-steps 64   # a quick look on a CPU
    tensorboard --logdir runs                                # read the logs
"""

import contextlib
import io
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
    init_fn: Literal["orthogonal", "xavier_uniform", "xavier_normal", "normed"] = "normed"
    """the weight initialisation: orthogonal (CleanRL), xavier_* (rllte), normed (the PPG paper)"""

    # PPG
    arch: Literal["dual", "shared", "detach"] = "dual"
    """dual: separate policy and value networks (the paper's default); shared: one network, the value
    loss trains it too; detach: one network, the value head reads detached features (CleanRL)"""
    n_iteration: Annotated[int, tyro.conf.arg(aliases=("--policy-epochs",))] = 32
    """N_pi, the policy iterations of a phase; the phase buffer holds their observations as uint8:
    num_steps x num_envs x n_iteration x 64 x 64 x 3 bytes, 6 GiB at the defaults (rllte: `policy_epochs`)"""
    e_policy: int = 1
    """E_pi, the policy epochs of each policy iteration"""
    v_value: int = 1
    """E_V, the value epochs of each policy iteration (run in the same passes as the policy epochs)"""
    e_auxiliary: Annotated[int, tyro.conf.arg(aliases=("--aux-epochs",))] = 6
    """E_aux, the auxiliary epochs of a phase (rllte: `aux_epochs`)"""
    beta_clone: Annotated[float, tyro.conf.arg(aliases=("--kl-coef",))] = 1.0
    """the weight of the behaviour-cloning KL(old policy || new policy) in the auxiliary loss (rllte: `kl_coef`)"""
    num_aux_rollouts: Annotated[int, tyro.conf.arg(aliases=("--num-aux-mini-batch",))] = 4
    """the whole env rollouts in one auxiliary minibatch (rllte's `num_aux_mini_batch` has this meaning too)"""
    n_aux_grad_accum: Annotated[int, tyro.conf.arg(aliases=("--num-aux-grad-accum",))] = 1
    """the auxiliary minibatches whose gradients add up to one optimizer step (rllte: `num_aux_grad_accum`)"""

    # Computed at runtime
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size (computed in runtime)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of iterations (computed in runtime)"""
    aux_batch_rollouts: tyro.conf.Suppress[int] = 0
    """the env rollouts in the phase buffer, num_envs x n_iteration (computed in runtime)"""
    num_phases: tyro.conf.Suppress[int] = 0
    """the number of phases (computed in runtime)"""


def check_args(args: Args) -> None:
    """Stop with one line naming the flag and its rule before any work starts; fill the computed fields."""

    def require(ok: bool, flag: str, rule: str) -> None:
        if not ok:
            print(f"{os.path.basename(sys.argv[0])}: error: --{flag}: {rule}", file=sys.stderr)
            raise SystemExit(2)

    require(args.env_id in PROCGEN_GAMES, "env-id", f"unknown game {args.env_id!r}; one of {', '.join(PROCGEN_GAMES)}")
    for flag in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "feature_dim", "n_iteration",
                 "e_policy", "v_value", "e_auxiliary", "num_aux_rollouts", "n_aux_grad_accum"):  # fmt: skip
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
    require(args.beta_clone >= 0, "beta-clone", "must be >= 0")
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
    phase_steps = args.batch_size * args.n_iteration
    require(args.total_timesteps >= phase_steps, "total-timesteps",
            f"must hold at least one phase of num_envs x num_steps x n_iteration = {phase_steps}")  # fmt: skip
    args.num_phases = args.total_timesteps // phase_steps
    args.num_iterations = args.num_phases * args.n_iteration
    args.aux_batch_rollouts = args.num_envs * args.n_iteration
    require(args.aux_batch_rollouts % (args.num_aux_rollouts * args.n_aux_grad_accum) == 0, "num-aux-rollouts",
            f"x n_aux_grad_accum must divide the {args.aux_batch_rollouts} rollouts of a phase")  # fmt: skip
    needed, available = phase_buffer_bytes(args) / 2**30, available_memory(args.device) / 2**30
    require(needed < available, "n-iteration", f"the phase buffer needs {needed:.1f} GiB but {available:.1f} GiB "
            "are available on the device: lower --n-iteration, --num-envs or --num-steps")  # fmt: skip


# [19] The phase buffer: every observation of a phase, kept as uint8 for the auxiliary phase.
def phase_buffer_bytes(args: Args) -> int:
    return args.num_steps * args.num_envs * args.n_iteration * (64 * 64 * 3 + 4)  # observations and returns


def available_memory(device: str) -> int:
    """Bytes free for the phase buffer: on the GPU when it trains there, else the host's available memory."""
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return torch.cuda.mem_get_info(torch.device(device if device != "auto" else "cuda"))[0]
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return 2**62  # no /proc (macOS): cannot tell, so do not refuse


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
        # [20] The PPG architectures: what the true value head reads, and what its loss trains.
        self.arch = args.arch
        if args.arch == "dual":
            self.value_network = impala_cnn(args.feature_dim, args.init_fn)
        # [21] The auxiliary value head on the policy's features: distils value knowledge into the policy network.
        self.aux_critic = head(args.feature_dim, args.hidden_dim, 1, critic_std, args.init_fn)

    def value_hidden(self, x, hidden):
        """The critic's input: its own network (dual), or the policy's features, detached (detach) or not (shared)."""
        if self.arch == "dual":
            return self.value_network(x)
        return hidden.detach() if self.arch == "detach" else hidden

    def get_value(self, x):
        x = x.permute((0, 3, 1, 2)) / 255.0  # "bhwc" -> "bchw", uint8 -> [0, 1]
        hidden = self.value_network(x) if self.arch == "dual" else self.network(x)
        return self.critic(hidden)

    def get_action_and_value(self, x, action=None):
        x = x.permute((0, 3, 1, 2)) / 255.0  # "bhwc" -> "bchw", uint8 -> [0, 1]
        hidden = self.network(x)
        logits = self.actor(hidden)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(self.value_hidden(x, hidden))

    def get_pi(self, x):
        """The policy's logits alone (the old policy of the auxiliary phase)."""
        return self.actor(self.network(x.permute((0, 3, 1, 2)) / 255.0))

    def get_pi_value_and_aux_value(self, x):
        x = x.permute((0, 3, 1, 2)) / 255.0  # "bhwc" -> "bchw", uint8 -> [0, 1]
        hidden = self.network(x)
        return (
            Categorical(logits=self.actor(hidden)),
            self.critic(self.value_hidden(x, hidden)),
            self.aux_critic(hidden),
        )


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


# [22] Behaviour cloning term of the auxiliary phase: KL(old policy || new policy).
def policy_kl(old_logits, new_logits):
    return torch.distributions.kl_divergence(Categorical(logits=old_logits), Categorical(logits=new_logits)).mean()


# [23] The auxiliary phase: distil the value into the policy network while cloning the old policy.
def auxiliary_phase(agent, optimizer, aux_obs, aux_returns, args: Args):
    """E_aux epochs over the phase buffer, `num_aux_rollouts` whole rollouts per minibatch; returns mean losses.

    `aux_obs` is (num_steps, rollouts, 64, 64, 3) uint8 and `aux_returns` (num_steps, rollouts).
    """
    num_rollouts = aux_obs.shape[1]
    # the old policy: its logits for the whole buffer, before any auxiliary step
    with torch.no_grad():
        chunks = [aux_obs[:, i : i + args.num_aux_rollouts] for i in range(0, num_rollouts, args.num_aux_rollouts)]
        aux_logits = torch.cat([agent.get_pi(c.flatten(0, 1)).unflatten(0, c.shape[:2]) for c in chunks], dim=1)
    stats = {"kl_loss": [], "aux_value_loss": [], "real_value_loss": []}
    optimizer.zero_grad()
    for _epoch in range(args.e_auxiliary):
        for i, mb_inds in enumerate(minibatch_indices(num_rollouts, args.num_aux_rollouts)):
            m_obs = aux_obs[:, mb_inds].reshape(-1, 64, 64, 3)
            m_returns = aux_returns[:, mb_inds].reshape(-1)
            m_logits = aux_logits[:, mb_inds].reshape(-1, aux_logits.shape[-1])
            new_pi, new_value, new_aux_value = agent.get_pi_value_and_aux_value(m_obs)
            kl_loss = policy_kl(m_logits, new_pi.logits)
            aux_value_loss = 0.5 * ((new_aux_value.view(-1) - m_returns) ** 2).mean()
            real_value_loss = 0.5 * ((new_value.view(-1) - m_returns) ** 2).mean()
            loss = aux_value_loss + args.beta_clone * kl_loss + real_value_loss
            # gradients of n_aux_grad_accum minibatches add up before a step; zeroed only after it
            (loss / args.n_aux_grad_accum).backward()
            if (i + 1) % args.n_aux_grad_accum == 0:
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            for key, value in (
                ("kl_loss", kl_loss),
                ("aux_value_loss", aux_value_loss),
                ("real_value_loss", real_value_loss),
            ):
                stats[key].append(value.item())
    return {key: float(np.mean(values)) for key, values in stats.items()}


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
    aux_obs = torch.zeros((args.num_steps, args.aux_batch_rollouts, 64, 64, 3), dtype=torch.uint8).to(device)
    aux_returns = torch.zeros((args.num_steps, args.aux_batch_rollouts)).to(device)
    print(f"phase buffer: {phase_buffer_bytes(args) / 2**30:.2f} GiB on {device}")

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

        # [19] Keep the rollout for the auxiliary phase, in the slot of this iteration of the phase.
        slot = (iteration - 1) % args.n_iteration
        aux_obs[:, slot * args.num_envs : (slot + 1) * args.num_envs] = obs
        aux_returns[:, slot * args.num_envs : (slot + 1) * args.num_envs] = returns

        # Optimizing the policy and value network
        clipfracs = []
        for epoch in range(max(args.e_policy, args.v_value)):
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
                # [24] E_pi policy epochs and E_V value epochs share their minibatch passes
                loss = (pg_loss - args.ent_coef * entropy_loss) * (epoch < args.e_policy) + v_loss * args.vf_coef * (
                    epoch < args.v_value
                )

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

        # [23] The auxiliary phase closes each phase of n_iteration policy iterations.
        if iteration % args.n_iteration == 0:
            aux_start = time.time()
            aux_stats = auxiliary_phase(agent, optimizer, aux_obs, aux_returns, args)
            for key, value in aux_stats.items():
                writer.add_scalar(f"losses/aux/{key}", value, global_step)
            print(
                f"phase {iteration // args.n_iteration}/{args.num_phases}  aux phase {time.time() - aux_start:.1f}s  "
                + "  ".join(f"{key} {value:.4f}" for key, value in aux_stats.items()),
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


def phase_buffer_help(argv):
    """The --help description, with the phase buffer's size for the flags given beside --help."""
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args = tyro.cli(Args, args=[a for a in argv if a not in ("-h", "--help")])
    except SystemExit:
        args = Args()
    return (
        f"PPG on Procgen. With these flags the phase buffer holds {args.num_steps} x {args.num_envs} x "
        f"{args.n_iteration} observations: {phase_buffer_bytes(args) / 2**30:.2f} GiB on the training device."
    )


if __name__ == "__main__":
    train(tyro.cli(Args, description=phase_buffer_help(sys.argv[1:]) if {"-h", "--help"} & set(sys.argv) else None))
