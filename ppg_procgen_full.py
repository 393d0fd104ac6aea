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
"""PPG on Procgen, PPO plus the auxiliary phase: the Procgen paper's easy generalisation setup (starpilot, 200 training
levels, 25M steps, 64 envs x 256 steps, 8 minibatches) with the PPG paper's phases (32 policy iterations, then 6
auxiliary epochs; separate policy and value networks). ppg_procgen.py is the lean reference; ppg_procgen_full.py is
the same file plus checkpoints, torchrun, RND, V-trace and more. A quick look on a CPU (1-2 min):
python ppg_procgen.py --total-timesteps 8192 --n-iteration 4 --num-envs 16 --num-steps 64 --e-auxiliary 1"""

import contextlib
import ctypes
import dataclasses
import functools
import io
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

# ── the plumbing ──: imported first, so that an unsupported Python or a missing package stops in one line
try:
    import plumbing
except ModuleNotFoundError as exc:  # a full file copied without plumbing.py
    if exc.name != "plumbing":
        raise
    sys.exit(f"{os.path.basename(__file__)}: error: plumbing.py is not beside it: copy the two together")
plumbing.serve(__file__)  # its messages and checkpoints name this script
# ── end the plumbing ──

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical

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
# ── checkpoints (PPG): the architecture, and the phase's length ──
plumbing.NETWORK_FLAGS += ("arch",)
plumbing.ROLLOUT_FLAGS += ("n_iteration",)
# ── end checkpoints (PPG) ──


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
    env_threads: int = 4
    """the number of procgen's own worker threads per vector env"""
    torch_threads: int = 0
    """torch's CPU threads; 0: one on a GPU (its host work is copies; idle OpenMP threads would spin on procgen's
    cores), torch's own number on a CPU"""
    total_timesteps: int = 25_000_000
    """total timesteps of the experiment"""
    learning_rate: float = 5e-4
    """the learning rate of the optimizer"""
    adam_eps: float = 1e-5
    """the epsilon of Adam (rllte: `eps`; OpenAI's PPG code: 1e-8)"""
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
    minibatch_size: int | None = None
    """the mini-batch size; when set, it replaces `num_minibatches` (rllte: `batch_size`)"""
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
    hidden_dim: int = 0
    """the size of a hidden layer in each head; 0 = linear heads, as in the papers"""
    init_fn: Literal["orthogonal", "torch_default", "tf_default", "normed", "xavier_uniform", "xavier_normal"] = (
        "normed"
    )
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
    # ── the features' flags ──
    capture_video: bool = False
    """if toggled, write videos of test env 0 (episodes 0, 1, 8, 27, ...) to `videos/{run_name}`"""
    # Checkpoints and evaluation
    checkpoint_interval: int = 0
    """write a checkpoint to `runs/{run_name}/checkpoints` every this many iterations (0: only on a stop signal),
    at the end of the phase where the interval falls: the phase buffer is spent there and left out"""
    checkpoint_aux_epochs: bool = False
    """also write a checkpoint after every auxiliary epoch but the last, with the whole phase buffer (6.0 GiB at the
    default sizes): for machines where one auxiliary phase outlasts a working session"""
    stop_at_phase_end: bool = False
    """a stop signal finishes the phase, its auxiliary epochs included, before the checkpoint, which then holds no
    rollouts (18.7 MB at the default sizes, not up to 6.0 GiB): for chunks that must travel (a campaign's)"""
    keep_checkpoints: int = 3
    """keep this many of the newest checkpoints (and the one the run resumed from)"""
    resume: str | None = None
    """continue from a checkpoint, or from the newest one in a run directory; its flags become the defaults"""
    eval_only: str | None = None
    """evaluate a checkpoint or a `--save-model` file: print the mean and std of the returns, and exit"""
    eval_episodes: int = 100
    """the number of episodes `--eval-only` plays"""
    eval_train_levels: bool = False
    """make `--eval-only` play the training levels instead of the held-out test levels"""
    # Options beyond the anchors
    cnn_channels: tuple[int, ...] = (16, 32, 32)
    """the IMPALA CNN's stacks, by their channels (OpenAI's PPG code's `chans`): narrower or fewer stacks are faster and
    learn less (the tests' runs use `2`: one stack); the Procgen paper found larger models more sample-efficient"""
    vtrace: bool = False
    """Metta's PPO loss: each epoch's value targets from GAE over the values as trained so far, each minibatch's policy
    advantages by V-trace over its own env segments with its own ratios, and the values refreshed after it"""
    vtrace_rho_clip: float = 1.0
    """the clip of the importance ratio rho that weights the V-trace TD errors"""
    vtrace_c_clip: float = 1.0
    """the clip of the trace ratio c that carries later TD errors back in V-trace"""
    prio_alpha: float = 0.0
    """prioritised minibatches of whole env segments, P ~ (sum of |advantage|)^alpha; 0 = off: each sample once"""
    prio_beta0: float = 0.6
    """the exponent of the importance weights (N P)^-beta at the start, annealed as Metta does: to beta0 + (1 - beta0)
    alpha at the run's end (0.84 at the defaults and alpha 0.6)"""
    intrinsic_coef: float = 0.0
    """the weight of RND's intrinsic reward, added to the extrinsic reward before GAE; 0 = off"""
    pretraining: bool = False
    """reward-free pretraining: the extrinsic reward is dropped and the intrinsic reward alone drives learning"""
    rnd_update_proportion: float = 0.25
    """the share of each minibatch that trains the RND predictor"""
    intrinsic_gamma: float = 0.99
    """the discount of the intrinsic return whose running std scales RND's reward (RND's and CleanRL's: 0.99)"""
    rnd_obs_norm_steps: int = 6400
    """random-policy steps of each env that RND's observation statistics start from, before training (RND's and
    CleanRL's code: 50 rollouts of 128 steps); 0: from the first rollout's"""
    init_model: str | None = None
    """start from the weights of a checkpoint or saved model (after --pretraining, say), with a fresh optimizer"""
    autocast: Literal["off", "bf16"] = "off"
    """run the network in bfloat16 autocast (losses, ratios and the optimizer stay in fp32)"""
    tune_malloc: bool = True
    """keep glibc's freed memory for reuse instead of unmapping it (about 1.7x faster updates on CPU)"""
    rollout: Literal["auto", "plain", "folded"] = "auto"
    """plain: the lean loop, then the test envs' own loop; folded: the test envs in the same forward pass, stepping
    beside the training envs; auto: folded on a GPU (one process), else plain. The same numbers on a CPU (the
    rollout's noise is drawn ahead, a step's at a time)"""
    compile: Literal["auto", "off", "default", "reduce-overhead"] = "auto"
    """torch.compile the loop's stages, each whole (the policy step, the advantages, the update minibatch, the
    auxiliary minibatch); `reduce-overhead` adds CUDA graphs on a GPU; auto: reduce-overhead on a GPU (one process:
    the first iteration compiles, about a minute; eager with --n-aux-grad-accum above 1), else off"""
    aux_optimizer: Literal["shared", "separate"] = "shared"
    """the auxiliary phase's Adam: `shared` with the policy phase (CleanRL's PPG, ours), or `separate`, one of its
    own, kept from phase to phase (OpenAI's PPG code)"""
    # The Procgen paper's PPO runs (train-procgen, baselines' PPO2): DETAILS.md, "Defaults and the reference setups"
    norm_reward_gamma: float | None = None
    """the discount of the return whose running std scales the rewards; None: `gamma` (CleanRL's); 0.99: the Procgen
    paper's runs (baselines' VecNormalize)"""
    norm_adv_minibatch: bool = False
    """normalise each minibatch's advantages again, by its own mean and std, as baselines' PPO2 did in the Procgen
    paper's runs (after `norm_adv`'s normalisation over the batch, which then changes nothing)"""
    # Distributed (under torchrun)
    backend: str | None = None
    """the torch.distributed backend under torchrun: gloo on CPU, nccl on CUDA when None"""
    # ── end the features' flags ──


# ── rllte aliases (PPG): rllte's PPG flags (Hsuanwu's PPGLearner) ──
ALGORITHM_ALIASES = {
    "n_iteration": "--policy-epochs", "e_auxiliary": "--aux-epochs", "beta_clone": "--kl-coef",
    "num_aux_rollouts": "--num-aux-mini-batch", "n_aux_grad_accum": "--num-aux-grad-accum",
    "num_minibatches": "--num-policy-mini-batch",  # the policy phase's minibatches
}  # fmt: skip
# ── end rllte aliases (PPG) ──
# ── rllte aliases ──: rllte's names for CleanRL's flags, `--lr 1e-3` for `--learning-rate 1e-3`
plumbing.add_aliases(Args, {**plumbing.RLLTE_ALIASES, **ALGORITHM_ALIASES})
# ── end rllte aliases ──


class ProcgenVecEnv(gym.vector.VectorEnv):
    """[1] Procgen as a vector env; a finished env restarts in the same `step`."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, num_envs, seed, video_dir=None, **procgen_kwargs):
        if procgen_kwargs["distribution_mode"] == "exploration":  # one level, procgen's
            del procgen_kwargs["num_levels"], procgen_kwargs["start_level"]
        # [2] Seeded level generator: which levels each env plays, in order
        self.env = Procgen(num=num_envs, rand_seed=seed, **procgen_kwargs)
        self.num_envs, self.gym3 = num_envs, hasattr(self.env, "act")  # else procgen-gym's
        # ── videos ──
        self.video_dir, self.video_episode, self.frames = video_dir, 0, []  # `--capture-video`: env 0's episodes
        # ── end videos ──
        self.single_observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
        self.single_action_space = gym.spaces.Discrete(15)  # in every game
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed=None, options=None):
        obs = self.env.observe()[1]["rgb"] if self.gym3 else self.env.reset()[0]
        self.frames = [obs[0]]  # --capture-video's first frame
        return obs, {}

    def step(self, actions):
        if self.gym3:
            self.env.act(np.asarray(actions, dtype=np.int32))
            reward, obs, first = self.env.observe()
            obs = obs["rgb"]
        else:  # procgen-gym's "terminated" is procgen's `first`
            obs, reward, first, _, _ = self.env.step(np.asarray(actions, dtype=np.int32))
        # ── videos ──
        if self.video_dir is not None:
            self.record(obs[0], first[0])
        # ── end videos ──
        return obs, reward, first, np.zeros_like(first), {}

    # ── videos ──
    def record(self, frame, episode_ended):
        """Keep the frames of env 0 and write episodes 0, 1, 8, 27, ... as mp4 files."""
        if episode_ended and round(self.video_episode ** (1 / 3)) ** 3 == self.video_episode:
            plumbing.write_video(f"{self.video_dir}/episode-{self.video_episode}.mp4", self.frames)
        if episode_ended:
            self.video_episode, self.frames = self.video_episode + 1, []
        self.frames.append(frame)

    # ── end videos ──

    # ── folded rollout [35] ──
    def start_ahead(self):
        """Let the policy step start the games' next step (`act_ahead`) before `step` waits for it."""
        if self.gym3:  # procgen-gym steps in `step` alone
            self.env = plumbing.AheadSteps(self.env)

    def act_ahead(self, actions):
        """Start the games' next step, and return at once; `step` then waits for it."""
        if self.gym3 and isinstance(self.env, plumbing.AheadSteps):
            self.env.act_ahead(np.asarray(actions, dtype=np.int32))

    # ── end folded rollout ──


def make_envs(num_envs, seed, num_levels, start_level, args: Args, video_dir=None):
    """`num_envs` games on `num_levels` levels from `start_level` (0: all)."""
    envs = ProcgenVecEnv(num_envs, seed, video_dir, env_name=args.env_id, distribution_mode=args.distribution_mode,
                         num_levels=num_levels, start_level=start_level, num_threads=args.env_threads)  # fmt: skip
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP  # as `dones` needs
    return envs


# [3] Initialisation: `std` is the norm of each output unit's weights
def layer_init(layer, std=np.sqrt(2), init_fn="orthogonal", bias_const=0.0):
    if init_fn == "orthogonal":
        torch.nn.init.orthogonal_(layer.weight, std)
    elif init_fn == "tf_default":  # glorot-uniform, gain 1
        torch.nn.init.xavier_uniform_(layer.weight)
    # ── rllte's init functions ──: `std` is the gain
    elif init_fn == "xavier_uniform":
        torch.nn.init.xavier_uniform_(layer.weight, std)
    elif init_fn == "xavier_normal":
        torch.nn.init.xavier_normal_(layer.weight, std)
    # ── end rllte's init functions ──
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


# ── rllte's hidden layer in the heads ──
def head(feature_dim, hidden_dim, out_dim, std, init_fn):
    if hidden_dim == 0:
        return layer_init(nn.Linear(feature_dim, out_dim), std, init_fn)
    return nn.Sequential(
        layer_init(nn.Linear(feature_dim, hidden_dim), np.sqrt(2), init_fn),
        nn.ReLU(),
        layer_init(nn.Linear(hidden_dim, out_dim), std, init_fn),
    )


# ── end rllte's hidden layer in the heads ──


# ── RND [33] ──: Random Network Distillation (Burda et al., 2018), novelty as the error of predicting a fixed
# random network
def rnd_cnn(out_layers):
    """The RND paper's convolutions (8x8/4, 4x4/2, 3x3/1; 32, 64, 64 channels) on 64x64 RGB, then `out_layers`."""
    convs = [nn.Conv2d(3, 32, 8, stride=4), nn.LeakyReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.LeakyReLU()]
    convs += [nn.Conv2d(64, 64, 3, stride=1), nn.LeakyReLU(), nn.Flatten()]
    return nn.Sequential(*[layer_init(m, np.sqrt(2)) if isinstance(m, nn.Conv2d) else m for m in convs], *out_layers)


class RND(nn.Module):
    """Target and predictor networks, and the running statistics RND normalises with (saved with the weights). Under
    torchrun the statistics are global: each update merges every process's batch, so that all processes hold the same
    statistics, and rank 0's checkpoint is every process's; the running return per env stays each process's own."""

    def __init__(self, num_envs, gamma, world_size=1):
        super().__init__()
        self.gamma, self.world_size = gamma, world_size
        self.target = rnd_cnn([layer_init(nn.Linear(64 * 4 * 4, 512), np.sqrt(2))]).requires_grad_(False)
        self.predictor = rnd_cnn([
            layer_init(nn.Linear(64 * 4 * 4, 512), np.sqrt(2)), nn.ReLU(),
            layer_init(nn.Linear(512, 512), np.sqrt(2)), nn.ReLU(),
            layer_init(nn.Linear(512, 512), np.sqrt(2)),
        ])  # fmt: skip
        self.register_buffer("obs_mean", torch.zeros(3, 64, 64))
        self.register_buffer("obs_var", torch.ones(3, 64, 64))
        self.register_buffer("obs_count", torch.tensor(0.0))
        self.register_buffer("return_mean", torch.tensor(0.0))
        self.register_buffer("return_var", torch.tensor(1.0))
        self.register_buffer("return_count", torch.tensor(0.0))
        self.register_buffer("intrinsic_return", torch.zeros(num_envs))  # a running, non-episodic return per env

    def merge(self, mean, var, count, batch):
        """Update a running mean and variance in place with a batch (Chan et al.'s parallel formula)."""
        b_mean, b_count = batch.mean(0), batch.shape[0] * self.world_size
        if self.world_size > 1:  # [30] the batch of all processes: its mean, then its variance about that mean
            dist.all_reduce(b_mean)
            b_mean /= self.world_size
            b_var = ((batch - b_mean) ** 2).sum(0)
            dist.all_reduce(b_var)
            b_var /= b_count
        else:
            b_var = batch.var(0, unbiased=False)
        delta, total = b_mean - mean, count + b_count
        var.copy_((var * count + b_var * b_count + delta**2 * count * b_count / total) / total)
        mean.add_(delta * b_count / total)
        count.fill_(total)

    def normalise(self, x):
        x = x.permute((0, 3, 1, 2)).float()
        return ((x - self.obs_mean) / (self.obs_var + 1e-8).sqrt()).clamp(-5, 5)

    def prediction_error(self, x):
        """Per observation: the mean squared error of the predictor against the target, on normalised pixels."""
        x = self.normalise(x)
        return ((self.predictor(x) - self.target(x)) ** 2).mean(1)

    @torch.no_grad()
    def intrinsic_reward(self, obs, next_obs_seq, chunk):
        """Rewards (T, N) for reaching `next_obs_seq`, over the std of their running discounted return, from the
        observation statistics as they stood before this rollout (as RND's `ppo_agent.py` and CleanRL's
        `ppo_rnd_envpool.py` compute them); the rollout's observations `obs` then update those statistics (in chunks,
        to bound memory), which the predictor's training sees."""
        flat = next_obs_seq.flatten(0, 1)
        error = torch.cat([self.prediction_error(flat[i : i + chunk]) for i in range(0, len(flat), chunk)])
        error = error.view(next_obs_seq.shape[:2])
        flat = obs.flatten(0, 1)
        for i in range(0, len(flat), chunk):
            self.merge(self.obs_mean, self.obs_var, self.obs_count, flat[i : i + chunk].permute((0, 3, 1, 2)).float())
        returns = []
        for t in range(len(error)):
            self.intrinsic_return.mul_(self.gamma).add_(error[t])
            returns.append(self.intrinsic_return.clone())
        self.merge(self.return_mean, self.return_var, self.return_count, torch.cat(returns))
        return error / (self.return_var + 1e-8).sqrt()


def warm_up_rnd(rnd, envs, next_obs, args: Args):
    """RND's observation statistics from `rnd_obs_norm_steps` steps of every env under uniformly random actions,
    before training, as RND's and CleanRL's code start them; the envs' next observation and done after them. The steps
    count for nothing else: no global step, no logged episode (the reward normaliser [14] does see their rewards)."""
    frames, next_done = [], torch.zeros(envs.num_envs, device=next_obs.device)
    for step in range(1, args.rnd_obs_norm_steps + 1):
        next_obs, _, terminations, truncations, _ = envs.step(
            np.random.randint(envs.single_action_space.n, size=envs.num_envs)
        )
        next_obs = torch.as_tensor(next_obs, device=rnd.obs_mean.device)
        frames.append(next_obs)
        if len(frames) == args.num_steps or step == args.rnd_obs_norm_steps:  # a rollout's worth at a time
            flat, frames = torch.cat(frames), []
            for i in range(0, len(flat), args.local_minibatch_size):  # in chunks, as intrinsic_reward merges
                batch = flat[i : i + args.local_minibatch_size].permute((0, 3, 1, 2)).float()
                rnd.merge(rnd.obs_mean, rnd.obs_var, rnd.obs_count, batch)
        next_done = torch.as_tensor(np.logical_or(terminations, truncations), device=rnd.obs_mean.device).float()
    return next_obs, next_done


def rnd_rewards(agent, obs, next_obs, rewards, args: Args):
    """The intrinsic reward of each step (for reaching its next observation), which joins the extrinsic one in
    `rewards` before GAE (rllte adds it after GAE, where it never reaches the update; in pretraining it replaces it);
    None without RND."""
    if args.intrinsic_coef == 0:
        return None
    next_obs_seq = torch.cat([obs[1:], next_obs[None]])  # the observation each step led to
    intrinsic = agent.rnd.intrinsic_reward(obs, next_obs_seq, args.local_minibatch_size)
    rewards.mul_(0.0 if args.pretraining else 1.0).add_(args.intrinsic_coef * intrinsic)
    return intrinsic


# ── end RND ──


def preprocess(x):
    return x.permute((0, 3, 1, 2)) / 255.0  # "bhwc" -> "bchw", uint8 -> [0, 1]


class Agent(nn.Module):
    def __init__(self, obs_shape, num_actions, feature_dim, init_fn, arch, hidden_dim=0, cnn_channels=(16, 32, 32)):
        super().__init__()
        self.network = impala_cnn(obs_shape, feature_dim, init_fn, cnn_channels)
        # [3] Heads: policy 0.01 (near-uniform first actions), value 1 (normed: both 0.1)
        actor_std, critic_std = (0.1, 0.1) if init_fn == "normed" else (0.01, 1.0)
        head_fn = "orthogonal" if init_fn.endswith("_default") else init_fn
        self.actor = head(feature_dim, hidden_dim, num_actions, actor_std, head_fn)
        self.critic = head(feature_dim, hidden_dim, 1, critic_std, head_fn)
        # [19] The PPG architectures: what the true value head reads, and what its loss trains
        self.arch = arch
        if arch == "dual":
            self.value_network = impala_cnn(obs_shape, feature_dim, init_fn, cnn_channels)
        # [20] The auxiliary value head on the policy's features: the value distilled into them
        self.aux_critic = head(feature_dim, hidden_dim, 1, critic_std, head_fn)

    def value_hidden(self, x, hidden):
        """The critic's input: its own network (dual), or the policy's features."""
        if self.arch == "dual":
            return self.value_network(x)
        return hidden.detach() if self.arch == "detach" else hidden

    def get_value(self, x):
        x = preprocess(x)
        return self.critic(self.value_network(x) if self.arch == "dual" else self.network(x))

    def get_action_and_value(self, x, action=None, noise=None):
        x = preprocess(x)
        hidden = self.network(x)
        probs = Categorical(logits=self.actor(hidden), validate_args=False)  # no GPU wait
        if action is None:
            # ── sampling without multinomial's checks [34] ──: `probs.sample()`'s draw (torch.multinomial's exponential
            # race: the same actions, seed for seed) without its validity checks (a dozen small kernels, asserted
            # asynchronously: no wait); [35] `noise` drawn ahead by a folded rollout
            noise = torch.empty_like(probs.probs).exponential_() if noise is None else noise
            action = (probs.probs / noise).argmax(-1)
            # ── end sampling without multinomial's checks ──
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
def policy_step(agent, next_obs, noise=None):
    """Observation in; the sampled action, its log-probability and the value out."""
    with torch.no_grad():
        action, logprob, _, value = agent.get_action_and_value(next_obs, noise=noise)  # [35] noise drawn ahead
    return action, logprob, value.flatten()


# [5] GAE (Schulman et al. 2016), (num_steps, num_envs): dones[t] = 1 if obs[t] starts an episode
# [28] V-trace, in the lines that differ: with `ratio` (pi_new / pi_old of the actions taken), Metta's PPO loss
# (Espeholt et al., 2018): delta_t = rho_t (r_t + gamma V_t+1 (1 - d_t+1) - V_t) and A_t = delta_t + gamma lambda c_t
# (1 - d_t+1) A_t+1, rho and c the ratio clipped at `rho_clip` and `c_clip`. Without it rho = c = 1: GAE, bit for bit
def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda, ratio=None, rho_clip=1.0, c_clip=1.0):
    rho = torch.ones_like(rewards) if ratio is None else ratio.clamp(max=rho_clip)
    c = torch.ones_like(rewards) if ratio is None else ratio.clamp(max=c_clip)
    nextvalues = torch.cat([values[1:], next_value.view(1, -1)])  # the value after each step
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done.view(1, -1)])
    advantages, lastgaelam = torch.zeros_like(rewards), 0
    for t in reversed(range(len(rewards))):
        delta = rho[t] * (rewards[t] + gamma * nextvalues[t] * nextnonterminal[t] - values[t])
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * c[t] * nextnonterminal[t] * lastgaelam
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
def auxiliary_phase(
    agent, optimizer, aux_obs, aux_returns, args: Args, progress=lambda text: None, after=None, resume=None, stage=None
):
    """E_aux epochs over the phase buffer (num_steps x rollouts), `num_aux_rollouts` whole
    rollouts a minibatch (the last may have fewer); returns the mean of each statistic."""
    # [25] `after(epoch, state)` is called after each epoch with a function that returns the phase's state so far (for
    # a checkpoint); `resume`, such a state, continues the phase after its epoch; [36] `stage`: aux_minibatch compiled
    num_rollouts, mb_rollouts = aux_obs.shape[1], args.num_aux_rollouts // args.world_size  # [30] this process's share
    # the old policy: its logits for the whole buffer, before any auxiliary step
    with torch.no_grad():
        chunks = [aux_obs[:, i : i + mb_rollouts] for i in range(0, num_rollouts, mb_rollouts)]
        old = (agent.get_pi(c.flatten(0, 1)).unflatten(0, c.shape[:2]) for c in chunks)  # not run on a resume [25]
        aux_logits = resume["logits"].to(aux_obs.device) if resume else torch.cat(list(old), dim=1)
    stats = {}  # each statistic's values, by name
    optimizer.zero_grad()
    # ── checkpoints [25]: the phase's state after an epoch, and a phase resumed from it ──
    if resume is not None:  # the losses so far (an epoch ends on an optimizer step: no gradients are pending)
        stats = {name: list(values.to(aux_obs.device)) for name, values in resume["stats"].items()}

    def state():
        return {
            "logits": aux_logits.cpu(),
            "stats": {name: torch.stack(values).cpu() for name, values in stats.items()},
        }

    # ── end checkpoints ──
    for _epoch in range(resume["epoch"] if resume else 0, args.e_auxiliary):
        minibatches = minibatch_indices(num_rollouts, mb_rollouts, aux_obs.device)
        for i, mb_inds in enumerate(minibatches):
            step = (i + 1) % args.n_aux_grad_accum == 0  # the gradients of n_aux_grad_accum minibatches add up
            mb = [
                plumbing.take(x, mb_inds, 1).flatten(0, 1) for x in (aux_obs, aux_returns, aux_logits)
            ]  # [8] whole rollouts
            for name, value in (stage or aux_minibatch)(agent, optimizer, mb, step, args).items():
                stats.setdefault(name, []).append(value)
            progress(f"auxiliary phase  epoch {_epoch + 1}/{args.e_auxiliary}  minibatch {i + 1}/{len(minibatches)}")
        # ── checkpoints [25]: between epochs, when one is due ──
        if after is not None:
            after(_epoch + 1, state)
        # ── end checkpoints ──
    means = torch.stack([torch.stack(values).mean() for values in stats.values()]).tolist()
    return dict(zip(stats, plumbing.rank_reduce(means, args.world_size), strict=True))  # [30]


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
        plumbing.all_reduce_grads(agent.parameters(), args.world_size)  # [30]
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
    stats = dict(kl_loss=kl_loss, aux_value_loss=aux_value_loss, real_value_loss=real_value_loss)
    return {name: value.detach() for name, value in stats.items()}


# ── prioritised sampling [29] of env segments (Metta's PPO loss; Schaul et al., 2016) ──
def prioritized_segments(priorities, num_minibatches, alpha, beta):
    """Segment indices (num_minibatches, segments per minibatch) and their importance weights, as Metta's PPO loss
    draws them: P(i) = (p_i^alpha + 1e-6) / (sum_j p_j^alpha + 1e-6) (uniform at alpha = 0), each minibatch drawn
    without replacement and independently of the others (a segment may come again in the epoch's next minibatch),
    weighted by (N P(i))^-beta. The weights are not divided by their maximum (Metta's choice, not Schaul et al.'s):
    at beta = 1 they average to 1 under P, keeping the loss's scale."""
    n, size = len(priorities), len(priorities) // num_minibatches
    scaled = np.nan_to_num(np.asarray(priorities, dtype=np.float64) ** alpha, nan=0, posinf=0, neginf=0)
    probs = (scaled + 1e-6) / (scaled.sum() + 1e-6)
    draws = np.stack([np.random.choice(n, size, replace=False, p=probs / probs.sum()) for _ in range(num_minibatches)])
    return draws, (n * probs[draws]) ** -beta


def minibatches(advantages, args: Args, beta):
    """[8] Shuffled samples, weight None; or whole env segments (columns of the rollout): [29] by priority, with their
    weights, or [28] for V-trace in Metta's order, weight None: minibatch k the k-th run of consecutive segments, so
    that every segment trains once an epoch."""
    if args.prio_alpha == 0 and not args.vtrace:
        mbs = minibatch_indices(args.local_batch_size, args.local_minibatch_size, advantages.device)
        return [(mb_inds, None) for mb_inds in mbs]
    steps = torch.arange(args.num_steps, device=advantages.device)[:, None] * args.local_num_envs  # t * num_envs
    if args.prio_alpha == 0:  # [28] + the env: the samples of a segment, on the device
        envs = torch.arange(args.local_num_envs, device=advantages.device).view(args.num_minibatches, -1)
        return [((steps + e).reshape(-1), None) for e in envs]
    envs, weights = prioritized_segments(
        advantages.abs().sum(0).cpu().numpy(), args.num_minibatches, args.prio_alpha, beta
    )
    envs = torch.as_tensor(envs, device=advantages.device)  # + the env: the samples of a segment, on the device
    weights = torch.as_tensor(weights, dtype=torch.float32, device=advantages.device)
    return [((steps + e).reshape(-1), w.repeat(args.num_steps)) for e, w in zip(envs, weights, strict=True)]


def vtrace_epoch(agent, epoch, batch, rewards, dones, next_value, next_obs, next_done, args: Args):
    """[28] Each epoch starts from GAE (ratio 1) over the batch, from the values as the minibatches before left them (a
    copy: the rollout's values stay, for explained variance) and the current network's bootstrap value: its advantages
    rank the segments [29], and with the values they replace the batch's, each minibatch's value targets
    (update_minibatch). The epoch's advantages, and what V-trace's minibatches take their part of (`vtrace_part`)."""
    refreshed = batch["values"].clone() if epoch == 0 else batch["values"]
    with torch.no_grad():
        next_value = next_value if epoch == 0 else agent.get_value(next_obs).reshape(1, -1)
        advantages = compute_gae(rewards, refreshed.view(args.num_steps, -1), dones, next_value, next_done,
                                 args.gamma, args.gae_lambda)[0]  # fmt: skip
    batch |= dict(advantages=advantages.reshape(-1), values=refreshed)
    return advantages, (rewards.reshape(-1), dones.reshape(-1), next_value[0], next_done, refreshed)


def vtrace_part(vtrace, mb_inds):
    """[28] What a minibatch of whole segments needs for V-trace: its rewards and dones, and its segments' bootstrap
    values and dones (the segments are the first step's samples)."""
    rewards, dones, next_value, next_done, _ = vtrace
    segments = mb_inds[: len(mb_inds) * len(next_value) // len(rewards)]  # the samples of the first step
    mb_next = (next_value[segments], next_done[segments])
    return plumbing.take(rewards, mb_inds), plumbing.take(dones, mb_inds), *mb_next


def vtrace_refresh(vtrace, mb_inds, rho_clipped, stats):
    """[28] After a minibatch's step, the loop's writes of what the step returned (in the stage, a write into a tensor
    it is given would cost it its CUDA graph: [36]): the clip counter adds the minibatch's clipped share, and the
    values in the copy of the buffer become those the step's forward pass computed (Metta: the values refreshed).
    Nothing without V-trace (`vtrace` None)."""
    if vtrace is None:
        return
    rho_clipped.add_(stats.pop("vtrace_rho_clipped"))
    vtrace[-1].index_copy_(0, mb_inds, stats.pop("vtrace_values"))


def option_stats(rho_clipped, minibatches, weight_means, intrinsic, args: Args):
    """The options' statistics, on the device: [28] the share of importance ratios above V-trace's clip, over the
    `minibatches`; [29] the mean importance weight of the sampled segments; [33] the mean normalised intrinsic reward
    (the predictor's loss is `rnd_loss`)."""
    stats = {"vtrace_rho_clipfrac": rho_clipped / minibatches} if args.vtrace else {}
    if args.prio_alpha > 0:
        stats["prio_mean_weight"] = torch.stack(weight_means).mean()
    if args.intrinsic_coef > 0:
        stats["intrinsic_reward"] = intrinsic.mean()
    return stats


def option_charts(logged, beta, args: Args):
    """The options' charts among the logged scalars: [33] the intrinsic reward, [29] the weights' exponent beta."""
    if args.intrinsic_coef > 0:
        logged["charts/intrinsic_reward"] = logged.pop("losses/intrinsic_reward")
    if args.prio_alpha > 0:
        logged["charts/prio_beta"] = beta


def weighted_mean(x, weights=None):
    """The mean, or with [29]'s importance weights the weighted mean sum(w x) / n."""
    return x.mean() if weights is None else (weights * x).mean()


# ── end prioritised sampling ──


def update_minibatch(agent, optimizer, mb, epoch, args: Args):
    """One minibatch's step; the `stats` (on the device) are logged by name."""
    mb_obs, mb_actions, mb_logprobs, mb_values = mb["obs"], mb["actions"], mb["logprobs"], mb["values"]  # by name
    mb_advantages, mb_returns, mb_weights, mb_vtrace = mb["advantages"], mb["returns"], mb["weights"], mb["vtrace"]
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, mb_actions)
    logratio = newlogprob - mb_logprobs
    ratio = logratio.exp()
    with torch.no_grad():  # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    # ── V-trace [28], Metta's PPO loss ──: the value targets are the epoch's GAE advantages plus the values as they
    # are now; the policy's advantages are V-trace's over the minibatch's env segments, with its own ratios
    if mb_vtrace is not None:
        mb_rewards, mb_dones, mb_next_value, mb_next_done = mb_vtrace
        mb_returns = mb_advantages + mb_values
        with torch.no_grad():
            # the ratio and the value detached: a view taken under no_grad of a tensor that requires grad fails to
            # compile in torch 2.11 (pytorch/pytorch#173926; 2.13 does on a CPU), as a GPU kit run found
            r, v, d, rho = (x.view(args.num_steps, -1) for x in (mb_rewards, mb_values, mb_dones, ratio.detach()))
            clips = (args.vtrace_rho_clip, args.vtrace_c_clip)  # a segment, as in the rollout
            gae = compute_gae(r, v, d, mb_next_value, mb_next_done, args.gamma, args.gae_lambda, rho, *clips)
            mb_advantages = gae[0].view(-1)
            if args.norm_adv:  # [17] Metta normalises each minibatch's V-trace advantages
                mb_mean, mb_std = plumbing.global_mean_std(mb_advantages, args.world_size)
                mb_advantages = (mb_advantages - mb_mean) / (mb_std + 1e-8)
            # for the loop to write (vtrace_refresh): the clipped share, and the values the buffer's copy takes
            vtrace_writes = dict(
                vtrace_rho_clipped=(ratio > args.vtrace_rho_clip).float().mean(), vtrace_values=newvalue.detach()[:, 0]
            )
    # ── end V-trace ──
    # ── per-minibatch advantages [17]: baselines' PPO2's normalisation (numpy's std: the population's) ──: of the
    # policy's advantages alone (with V-trace, after its value targets are taken from the epoch's GAE)
    if args.norm_adv_minibatch:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std(correction=0) + 1e-8)
    # ── end per-minibatch advantages ──
    # [29] The importance weights reach the policy loss alone, as in Metta's (its value loss is a plain mean).
    pg_loss = weighted_mean(clipped_policy_loss(logratio, mb_advantages, args.clip_coef), mb_weights)
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
    stats |= vtrace_writes if mb_vtrace is not None else {}  # [28] V-trace's, for the loop to write
    # ── RND [33]: the predictor learns on a random share of each minibatch ──
    if args.intrinsic_coef > 0:
        share = torch.rand(len(mb_obs), device=mb_obs.device) < args.rnd_update_proportion
        rnd_loss = (agent.rnd.prediction_error(mb_obs) * share).sum() / share.sum().clamp(min=1)
        loss = loss + rnd_loss
        stats["rnd_loss"] = rnd_loss  # logged as losses/rnd_loss
    # ── end RND ──
    optimizer.zero_grad()
    loss.backward()
    plumbing.all_reduce_grads(agent.parameters(), args.world_size)  # [30]
    # [10] Global gradient-norm clipping, as in CleanRL (OpenAI's PPG code does not clip).
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return {name: value.detach() for name, value in stats.items()}


def log_episodes(episodes, infos, global_step, tag):
    """[11] Keep every episode that ended in a step, not only the first."""
    for i in np.flatnonzero(infos.get("_episode", [])):
        episodes.append((tag, global_step, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))


# ── the auxiliary phase with its checkpoints (PPG) [22], [25] ──
class AuxiliaryPhase:
    """[22] The auxiliary phase that closes each phase, run and logged by `close` (at a phase's last iteration, or to
    finish one that a checkpoint stopped inside), and [25] the checkpoints around it: `after` an iteration (at the
    interval at a phase's end; mid-phase on a signal) and after an auxiliary epoch, each with this process's part and
    the phase buffer so far. The run's (plumbing.Run) agent, optimizers, games and log; the loop's counters and its
    last observations (`last`: the next observations and dones, the test envs' observations) come in as arguments."""

    def __init__(self, run, aux, args: Args):
        self.run, (self.aux_obs, self.aux_returns), self.args = run, aux, args
        if args.stop_at_phase_end:  # what the stop signals' handler says it finishes first
            run.stop.until = "this phase, its auxiliary epochs included"

    def resume(self, global_step, last, stage):
        """A resumed run's phase so far [24]; stopped inside an auxiliary phase, that phase finished, then go on."""
        mine = self.run.mine or {}
        for buffer, key in ((self.aux_obs, "aux_obs"), (self.aux_returns, "aux_returns")):
            if key in mine:
                buffer[:, : mine[key].shape[1]] = mine[key].to(buffer.device)
        if mine.get("aux") is not None:
            iteration = self.run.ckpt["iteration"]
            self.close(iteration, global_step, last, stage, mine["aux"])
            self.after(iteration, global_step, last)

    def close(self, iteration, global_step, last, stage, resume=None):
        """The auxiliary phase (`resume`: the rest of one), its statistics and seconds logged at `global_step`."""
        aux_start, after, run = time.time(), functools.partial(self.inside, iteration, global_step, last), self.run
        show = functools.partial(run.progress, iteration, global_step=global_step)  # the status line
        aux = (self.aux_obs, self.aux_returns)
        aux_stats = auxiliary_phase(run.agent, run.optimizers[-1], *aux, self.args, show, after, resume, stage)
        run.writer.add_scalar("perf/aux_seconds", time.time() - aux_start, global_step)  # [32]
        for name, value in aux_stats.items():
            run.writer.add_scalar(f"losses/aux/{name}", value, global_step)
        losses = "  ".join(f"{name} {value:.4f}" for name, value in aux_stats.items())
        plumbing.console(f"phase {iteration // self.args.n_iteration}/{self.args.num_phases}  {losses}")

    def my_part(self, filled, last):
        """This process's part of a checkpoint (plumbing.Run.my_part) and the first `filled` rollouts of the phase
        buffer [24] (some inside a phase, none at its end, all inside its auxiliary phase)."""

        def phase(x):  # a copy of a part: a view would save the whole 6 GiB storage (on CPU `.cpu()` is a view)
            return x.cpu() if filled == x.shape[1] else x[:, :filled].cpu().clone()

        return self.run.my_part(last, aux_obs=phase(self.aux_obs), aux_returns=phase(self.aux_returns))

    def after(self, iteration, global_step, last):
        """At the interval, or when a signal asked to stop (then exit). The interval's checkpoints wait for the phase's
        end, where the phase buffer is spent and left out; only a signal mid-phase writes the phase so far."""
        signum, args, path = self.run.signalled(), self.args, None
        phase_end, interval = iteration % args.n_iteration == 0, args.checkpoint_interval
        signum = signum if phase_end or not args.stop_at_phase_end else 0  # asked to: stop at the phase's end
        crossed = interval and iteration // interval > (iteration - args.n_iteration) // interval  # in this phase
        if (phase_end and crossed) or signum:
            mine = self.my_part(iteration % args.n_iteration * self.run.envs.num_envs, last)
            path = self.run.write(iteration, global_step, mine)
        self.run.exit_if(signum, f"iteration {iteration}", path)

    def inside(self, iteration, global_step, last, epoch, aux_state):
        """After an auxiliary epoch but the last, with `--checkpoint-aux-epochs` or when a signal asked to stop (then
        exit): the whole phase buffer, the old policy's logits and the epochs done, for a resume to go on from."""
        signum = 0 if self.args.stop_at_phase_end else self.run.signalled()  # asked to: stop at the phase's end
        if epoch == self.args.e_auxiliary or not (signum or self.args.checkpoint_aux_epochs):
            return
        mine = {**self.my_part(self.aux_obs.shape[1], last), "aux": {**aux_state(), "epoch": epoch}}
        path = self.run.write(iteration, global_step, mine, epoch)
        self.run.exit_if(signum, f"auxiliary epoch {epoch} of iteration {iteration}", path)


# ── end the auxiliary phase with its checkpoints (PPG) ──


@plumbing.keeps_process_settings
def train(args: Args):
    given = dataclasses.asdict(args)  # the flags as given: checkpoints keep them, `--resume` makes them the defaults
    check_args(args)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_phases = args.total_timesteps // (args.batch_size * args.n_iteration)
    args.num_iterations = args.num_phases * args.n_iteration
    if args.tune_malloc:
        tune_allocator()  # [12] speed only
    if args.eval_only is not None:  # [27] a saved agent's evaluation, and nothing else
        return plumbing.evaluate_saved(args, Agent, make_envs)
    device = torch.device(args.device)
    run = plumbing.Run(args, given, device)  # [30] torchrun's processes, [25] the run's directory and checkpoint
    if run.complete:
        return run.name
    run_name = run.name
    if args.track and args.rank == 0:
        import wandb

        kwargs = dict(project=args.wandb_project_name, entity=args.wandb_entity, name=run_name)
        wandb.init(**kwargs, sync_tensorboard=True, config=vars(args), monitor_gym=True, save_code=True)
    writer = run.event_writer()  # [25] a resumed run's log goes on; [30] rank 0's
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed + args.rank)  # [30] each process shuffles its own minibatches
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.benchmark = not args.torch_deterministic

    # env setup: [13] the training levels; test envs on all levels
    env_seed, test_envs, test_obs = args.seed + 7919 * args.rank, None, None  # [30] every process its own levels
    envs = make_envs(args.local_num_envs, env_seed, args.num_levels, args.start_level, args)
    if args.norm_reward:  # [14] divided by the discounted return's std, clipped
        envs = gym.wrappers.vector.NormalizeReward(envs, gamma=args.norm_reward_gamma or args.gamma)
        envs = gym.wrappers.vector.TransformReward(envs, lambda r: np.clip(r, -args.clip_reward, args.clip_reward))
    if args.eval_interval > 0:
        test_envs = make_envs(args.num_eval_envs // args.world_size, env_seed + 1_000_003, 0, 0, args, run.video_dir())
        test_obs = torch.as_tensor(test_envs.reset()[0], device=device)

    num_actions, arch = envs.single_action_space.n, args.arch
    agent = Agent(envs.single_observation_space.shape, num_actions, args.feature_dim, args.init_fn, arch,
                  args.hidden_dim, args.cnn_channels)  # fmt: skip
    if args.intrinsic_coef > 0:  # [33] RND's networks and statistics
        agent.rnd = RND(args.local_num_envs, args.intrinsic_gamma, args.world_size)
    agent = agent.to(device, memory_format=torch.channels_last)  # NHWC, as the frames
    plumbing.agent_options(agent, envs, test_envs, args)  # [31] bf16, [35] the rollout, --init-model, [30] torchrun
    # [15] Adam epsilon 1e-5 as in PPO2 and CleanRL (OpenAI's PPG code: 1e-8)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    separate = args.aux_optimizer == "separate"  # the auxiliary phase's own Adam: its steps scale by its own moments
    aux_optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps) if separate else optimizer
    optimizers = (optimizer, aux_optimizer)  # what a checkpoint saves

    # ALGO Logic: Storage setup; observations stay uint8
    obs = torch.zeros((args.num_steps, *envs.observation_space.shape), dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, envs.num_envs), dtype=torch.long, device=device)
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, envs.num_envs), device=device) for _ in range(4))
    to_device = plumbing.ToDevice(device)  # [34] pinned copies
    # [24] The phase buffer: every observation of a phase, as uint8, for the auxiliary phase
    aux_shape = (args.num_steps, envs.num_envs * args.n_iteration)
    aux_obs = torch.zeros((*aux_shape, 64, 64, 3), dtype=torch.uint8, device=device)
    aux_returns = torch.zeros(aux_shape, device=device)

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    next_obs = torch.as_tensor(envs.reset()[0], device=device)
    next_done = torch.zeros(envs.num_envs, device=device)
    recent_returns, recent_test_returns = deque(maxlen=100), deque(maxlen=100)
    recent = (recent_returns, recent_test_returns)  # [25] a checkpoint's run goes on exactly where it stopped
    state = run.resume(agent, optimizers, envs, test_envs, recent, writer, global_step, next_obs, next_done, test_obs)
    global_step, next_obs, next_done, test_obs = state
    if args.intrinsic_coef > 0 and not run.ckpt:  # [33] observation statistics from a random policy's steps
        next_obs, next_done = warm_up_rnd(agent.rnd, envs, next_obs, args)
    stages = [globals()[name] for name in ("policy_step", "compute_gae", "update_minibatch", "aux_minibatch")]
    stages = plumbing.compiled_stages(stages, optimizers, device, args)  # [36] compiled or not
    policy_step, compute_gae, update_minibatch, aux_minibatch = stages
    if args.compile != "off":  # the KL's dispatch table fills at its first lookup, and dynamo guards on it: filled now
        policy_kl(torch.zeros(1, 2), torch.zeros(1, 2))
    run.start_clock(global_step)  # [25] the steps per second count from here, on a resume too
    phase = AuxiliaryPhase(run, (aux_obs, aux_returns), args)  # [22] with its checkpoints [25]
    phase.resume(global_step, (next_obs, next_done, test_obs), aux_minibatch)  # [25] a phase stopped inside, finished

    for iteration in range(run.start_iteration, args.num_iterations + 1):
        iteration_start, episodes, last_good = time.time(), [], run.last_good(iteration)  # [26] divergence guard
        if args.anneal_lr:  # [16] over the whole run
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            plumbing.set_lr(optimizer, lrnow)  # [36] in place where it is a device tensor
            plumbing.set_lr(aux_optimizer, lrnow)  # a separate auxiliary optimizer's too

        timer, tests = plumbing.Timer(), (test_envs, test_obs)  # [32] where the time goes, logged as perf/*
        policy = plumbing.RolloutPolicy(agent, policy_step, envs, *tests, args, to_device, iteration, log_episodes)
        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done
            # ALGO LOGIC: action logic
            timer.lap()  # [32]
            action, logprobs[step], values[step] = policy(next_obs)  # [35] policy_step, or folded
            actions[step] = action
            action = policy.on_host(action)  # [35] copied back once
            timer.lap("inference")  # [32]
            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminations, truncations, infos = envs.step(action)
            policy.step_test_envs()  # [35] a folded rollout's test envs
            timer.lap("env")  # [32]
            rewards[step] = to_device("reward", reward).view(-1)
            next_obs = to_device("obs", next_obs)
            next_done = to_device("done", np.logical_or(terminations, truncations), torch.float32)
            log_episodes(episodes, infos, global_step, "")
            run.progress(iteration, f"rollout {step + 1}/{args.num_steps}", global_step)

        test_obs = policy.test_results(test_obs, episodes, global_step)  # [35] folded: the test envs' episodes
        timer.lap()  # [32]
        if policy.eval_now and not policy.folded:  # [13] the same policy (or [35] folded into the rollout)
            # test actions from their own generator: training's draws stay the same
            with torch.random.fork_rng([device] if device.type == "cuda" else []):
                torch.manual_seed(env_seed + 1_000_003 + iteration)  # [30] each process's own draws
                for _ in range(args.num_steps):
                    test_action = policy_step(agent, test_obs)[0]
                    test_obs, _, _, _, test_infos = test_envs.step(test_action.cpu().numpy())
                    test_obs = to_device("test_obs", test_obs)
                    log_episodes(episodes, test_infos, global_step, "test_")

        timer.lap("eval")  # [32]
        intrinsic = rnd_rewards(agent, obs, next_obs, rewards, args)  # [33] RND's reward joins the rewards; or None
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
            b_mean, b_std = plumbing.global_mean_std(b_advantages, args.world_size)  # [30] over all processes' batches
            b_advantages = (b_advantages - b_mean) / (b_std + 1e-8)
        # [24] The rollout, kept for the auxiliary phase in this iteration's slot of the phase
        slot = (iteration - 1) % args.n_iteration * envs.num_envs
        aux_obs[:, slot : slot + envs.num_envs] = obs
        aux_returns[:, slot : slot + envs.num_envs] = returns

        # Optimizing the policy and value network
        clipfracs, batch = [], dict(obs=b_obs, actions=b_actions, logprobs=b_logprobs, values=b_values)  # by name
        batch |= dict(advantages=b_advantages, returns=b_returns)
        rho_clipped, mb_weight_means, vtrace = torch.zeros((), device=device), [], None  # [28], [29]
        beta = args.prio_beta0 + (1 - args.prio_beta0) * args.prio_alpha * (iteration - 1) / args.num_iterations  # [29]
        for epoch in range(max(args.e_policy, args.v_value)):
            if args.vtrace:  # [28] Metta's PPO loss: each epoch's advantages from the values as trained so far
                advantages, vtrace = vtrace_epoch(
                    agent, epoch, batch, rewards, dones, next_value, next_obs, next_done, args
                )
            for mb_inds, mb_weights in minibatches(advantages, args, beta):  # [29]
                mb_vtrace = vtrace and vtrace_part(vtrace, mb_inds)  # [28] None without V-trace
                mb = {key: plumbing.take(x, mb_inds) for key, x in batch.items()}  # [8] by name
                mb |= dict(weights=mb_weights, vtrace=mb_vtrace)  # [29], [28]
                stats = update_minibatch(agent, optimizer, mb, epoch, args)
                vtrace_refresh(vtrace, mb_inds, rho_clipped, stats)  # [28] the loop writes what V-trace's step returned
                clipfracs.append(stats["clipfrac"])
                if mb_weights is not None:  # [29]
                    mb_weight_means.append(mb_weights.mean())
                run.progress(iteration, f"update, epoch {epoch + 1}", global_step)

            # [18] Early stop once the policy moved too far
            kl = args.target_kl and plumbing.rank_reduce([stats["approx_kl"].item()], args.world_size)[0]  # [30]
            if args.target_kl is not None and kl > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        timer.lap("update")  # [32]
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        stats["clipfrac"] = torch.stack(clipfracs).mean()  # the rest: the last minibatch's
        stats |= option_stats(rho_clipped, len(clipfracs), mb_weight_means, intrinsic, args)  # [28], [29], [33]
        read = torch.stack(list(stats.values())).tolist()  # one read from the device
        logged = {f"losses/{name}": value for name, value in zip(stats, read, strict=True)}
        logged["losses/explained_variance"] = explained_var
        logged["charts/learning_rate"] = optimizer.param_groups[0]["lr"]
        option_charts(logged, beta, args)  # [29], [33] charts, not losses
        run.log(iteration, global_step, logged, episodes, iteration_start, timer.seconds)  # [30] all processes', [11]

        # [22] The auxiliary phase closes each phase of n_iteration policy iterations.
        if iteration % args.n_iteration == 0:
            phase.close(iteration, global_step, (next_obs, next_done, test_obs), aux_minibatch)  # [25] too
        run.guard(stats, last_good, iteration)  # [26] a non-finite loss or parameter stops the run
        phase.after(iteration, global_step, (next_obs, next_done, test_obs))  # [25] checkpoints: interval, signal

    run.close(global_step)  # [30] every process's weights the same at the end
    envs.close()
    if args.eval_interval > 0:
        test_envs.close()
    writer.close()
    run.end()  # --save-model, and [25] exit status 4 without the last checkpoint or the model
    return run_name


def tune_allocator():
    """[12] One glibc heap, never trimmed: big buffers reused, not mapped anew (2x on a CPU)"""
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        for option, value in ((-4, 0), (-1, 2**31 - 1), (-8, 1)):  # M_MMAP_MAX, M_TRIM_THRESHOLD, M_ARENA_MAX
            ctypes.CDLL("libc.so.6").mallopt(option, value)


# ── the algorithm's rules (PPG): the game's, its flags' and options' rules and warnings, its checks, its memory ──
# (the rules of the plumbing's flags: plumbing.RULES)
ALGORITHM_RULES = {
    ("env_id",): (f"must be a Procgen game: {', '.join(PROCGEN_GAMES)}", lambda v, a: v in PROCGEN_GAMES),
    ("distribution_mode",): ("is not made for this game", lambda v, a: a.env_id in MODE_GAMES.get(v, a.env_id).split()),
    ("total_timesteps",): (
        "must hold one phase of --num-envs x --num-steps x --n-iteration",
        lambda v, a: v >= a.num_envs * a.num_steps * a.n_iteration,
    ),
    ("n_iteration", "e_policy", "v_value", "e_auxiliary", "num_aux_rollouts", "n_aux_grad_accum"): (
        "must be positive",
        lambda v, a: v > 0,
    ),
    ("beta_clone",): ("must be >= 0", lambda v, a: v >= 0),
    # the options' rules: V-trace [28], prioritised sampling [29], RND [33]
    ("vtrace_rho_clip", "vtrace_c_clip"): ("must be positive", lambda v, a: v > 0),
    ("prio_alpha", "intrinsic_coef"): ("must be >= 0", lambda v, a: v >= 0),
    ("prio_beta0",): ("must be in [0, 1]", lambda v, a: 0 <= v <= 1),
    ("rnd_update_proportion",): ("must be in (0, 1]", lambda v, a: 0 < v <= 1),
    ("intrinsic_gamma",): ("must be in [0, 1]", lambda v, a: 0 <= v <= 1),
    ("rnd_obs_norm_steps",): ("must be in [0, 2^31)", lambda v, a: 0 <= v < 2**31),
    ("pretraining",): ("needs an intrinsic reward: --intrinsic-coef > 0", lambda v, a: not v or a.intrinsic_coef > 0),
}
ALGORITHM_WARNINGS = {
    ("total_timesteps",): (
        "over 1% is not run: whole phases only",
        lambda v, a: v % (a.num_envs * a.num_steps * a.n_iteration) > v / 100,
    ),
    # the options' warnings
    ("vtrace_rho_clip",): ("has no effect without --vtrace", lambda v, a: v != Args.vtrace_rho_clip and not a.vtrace),
    ("vtrace_c_clip",): ("has no effect without --vtrace", lambda v, a: v != Args.vtrace_c_clip and not a.vtrace),
    ("prio_beta0",): ("has no effect without --prio-alpha > 0", lambda v, a: v != Args.prio_beta0 and not a.prio_alpha),
    ("intrinsic_gamma",): (
        "has no effect without --intrinsic-coef > 0",
        lambda v, a: v != Args.intrinsic_gamma and not a.intrinsic_coef,
    ),
    ("rnd_update_proportion",): (
        "has no effect without --intrinsic-coef > 0",
        lambda v, a: v != Args.rnd_update_proportion and not a.intrinsic_coef,
    ),
}


def check_algorithm(args: Args):
    """The auxiliary phase's minibatches: whole rollouts of a phase, shared among the processes; as CleanRL's, the
    last of an epoch may hold fewer, and every optimizer step closes a whole group of `n_aux_grad_accum` of them (an
    epoch ends on a step: a checkpoint between epochs holds no pending gradients)."""
    minibatches = -(-args.num_envs * args.n_iteration // args.num_aux_rollouts)  # [22] the last may be smaller
    if minibatches % args.n_aux_grad_accum:
        plumbing.arg_error("n-aux-grad-accum", f"must divide the {minibatches} auxiliary minibatches of an epoch (the "
                  f"phase's {args.num_envs * args.n_iteration} rollouts, --num-aux-rollouts {args.num_aux_rollouts} a "
                  "minibatch)", args.n_aux_grad_accum)  # fmt: skip
    if args.n_aux_grad_accum > 1 and args.compile == "reduce-overhead":  # [36] a replay overwrites the graph's .grad
        rule = "adds gradients across compiled calls, which CUDA graphs overwrite: with --compile reduce-overhead"
        plumbing.arg_error("n-aux-grad-accum", f"{rule} it must be 1 (or use --compile default)", args.n_aux_grad_accum)
    if args.prio_alpha > 0 and args.local_num_envs % args.num_minibatches:  # [29] whole segments
        plumbing.arg_error("prio-alpha", "samples whole env segments: each process's envs must be a multiple of "
                           "--num-minibatches", args.prio_alpha)  # fmt: skip
    if args.vtrace and args.local_num_envs % args.num_minibatches:  # [28] as Metta's, minibatches of whole segments
        plumbing.arg_error("vtrace", "takes minibatches of whole env segments: each process's envs must be a multiple "
                           "of --num-minibatches", True)  # fmt: skip
    if args.num_aux_rollouts % args.world_size:
        plumbing.arg_error(
            "num-aux-rollouts", f"must divide among the {args.world_size} processes of torchrun", args.num_aux_rollouts
        )


def memory_needed(args: Args, minibatch_size):
    """This process's bytes, and the flags that size them: the rollout (a uint8 frame, 6 numbers a step), the phase
    buffer [24] (a frame, a return a step), the activations of a policy or an auxiliary minibatch (1.5 MiB a sample a
    network), games (0.3 MiB each)."""
    work = max(minibatch_size, args.num_aux_rollouts * args.num_steps) * (2 if args.arch == "dual" else 1)
    need = args.local_batch_size * 12312 + phase_buffer_bytes(args)  # [30] this process's share
    need += (1.5 * work + 0.3 * (args.num_envs + args.num_eval_envs) / args.world_size) * 2**20
    sizes = (f"num-envs {args.num_envs} x --num-steps {args.num_steps} / --num-minibatches {args.num_minibatches}, "
             f"--n-iteration {args.n_iteration}, --num-aux-rollouts {args.num_aux_rollouts}, "
             f"--num-eval-envs {args.num_eval_envs}")  # fmt: skip
    return need, sizes


def phase_buffer_bytes(args: Args) -> int:
    """[24] The bytes of this process's phase buffer: observations as uint8, and the returns."""
    return args.num_steps * (args.num_envs // args.world_size) * args.n_iteration * (64 * 64 * 3 + 4)


# ── end the algorithm's rules (PPG) ──


def check_args(args: Args):
    """The common mistakes, each in one line (tyro rejects a wrong type)."""
    # ── every flag's rule ──
    plumbing.check_every_flag(args, ALGORITHM_RULES, ALGORITHM_WARNINGS, check_algorithm, memory_needed)
    # ── end every flag's rule ──
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
    plumbing.main(train, Args)  # [25] a checkpoint's flags as the defaults; tyro's errors in one line
