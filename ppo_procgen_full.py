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
8 minibatches, 3 epochs), held-out test levels. ppo_procgen.py, the lean reference, plus checkpoints, torchrun, RND,
V-trace and more. A quick look on a CPU: python ppo_procgen_full.py --total-timesteps 8192 --num-envs 8 --num-steps 64
Two GPUs: torchrun --standalone --nproc-per-node 2 ppo_procgen_full.py --checkpoint-interval 10"""

import contextlib
import copy
import ctypes
import dataclasses
import errno
import fcntl
import functools
import glob
import importlib.util
import io
import itertools
import os
import pickle
import random
import re
import signal
import socket
import sys
import threading
import time
import typing
from collections import deque
from dataclasses import dataclass
from typing import Literal

# ── one-line errors: an unsupported Python, a missing package ──
SCRIPT = os.path.basename(__file__)[: -len(".py")]
if not (3, 10) <= sys.version_info[:2] <= (3, 13):  # no procgen package is built for another Python (requirements.txt)
    sys.exit(f"{SCRIPT}.py: error: Python {sys.version.split()[0]} has no procgen package: use Python 3.10 to 3.13")


def installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # ValueError: blocked in sys.modules
        return False


for module in ("gymnasium", "numpy", "torch", "tyro", "tensorboard", ("procgen", "procgen_gym")):
    if not any(installed(name) for name in (module if isinstance(module, tuple) else (module,))):
        missing = module if isinstance(module, str) else "procgen"
        sys.exit(f"{SCRIPT}.py: error: {missing} is not installed for Python {sys.version.split()[0]}: "
                 "pip install -r requirements.txt")  # fmt: skip
# ── end one-line errors ──

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import tyro
from tensorboard.compat.proto.summary_pb2 import Summary
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
# ── checkpoints: the flags a checkpoint must share with a run that loads it (the network, and the rollout) ──
NETWORK_FLAGS = ("feature_dim", "hidden_dim", "cnn_channels")  # as Agent's arguments are named
ROLLOUT_FLAGS = ("env_id", "distribution_mode", "num_levels", "start_level", "num_envs", "num_steps", "num_eval_envs")
# ── end checkpoints ──


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
    update_epochs: int = 3
    """the K epochs to update the policy"""
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
        "orthogonal"
    )
    """the initialisation (`layer_init`)"""
    save_model: bool = False
    """whether to save model into the `runs/{run_name}` folder"""
    # ── the features' flags ──
    capture_video: bool = False
    """if toggled, write videos of test env 0 (episodes 0, 1, 8, 27, ...) to `videos/{run_name}`"""
    # Checkpoints and evaluation
    checkpoint_interval: int = 0
    """write a checkpoint to `runs/{run_name}/checkpoints` every this many iterations (0: only on a stop signal)"""
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
    rollout: Literal["plain", "folded", "pipelined"] = "plain"
    """plain: the lean loop, then the test envs' own loop; folded: the test envs in the same forward pass, stepping
    beside the training envs; pipelined: folded, and the training envs in two halves, one stepping while the other's
    actions are computed. The same numbers on a CPU (the rollout's noise is drawn ahead, in the same order)"""
    compile: Literal["off", "default", "reduce-overhead"] = "off"
    """torch.compile the loop's three stages, each whole (the policy step, the advantages, the update minibatch);
    `reduce-overhead` adds CUDA graphs on a GPU"""
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


# ── rllte aliases (PPO): rllte's PPO flags ──
ALGORITHM_ALIASES = {"update_epochs": "--n-epochs"}
# ── end rllte aliases (PPO) ──
# ── rllte aliases ──: rllte's names for CleanRL's flags, `--lr 1e-3` for `--learning-rate 1e-3`
RLLTE_ALIASES = {
    "exp_name": "--tag", "init_model": "--init-model-path", "learning_rate": "--lr", "adam_eps": "--eps",
    "gamma": "--discount", "minibatch_size": "--batch-size", "clip_coef": "--clip-range", **ALGORITHM_ALIASES,
}  # fmt: skip
for _name, _alias in RLLTE_ALIASES.items():
    Args.__dataclass_fields__[_name].type = Args.__annotations__[_name] = typing.Annotated[
        Args.__annotations__[_name], tyro.conf.arg(aliases=(_alias,))
    ]
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
        self.make_part = functools.partial(Procgen, rand_seed=seed, **procgen_kwargs)  # [35] a pipelined rollout's
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

    # ── end videos ──

    # ── folded and pipelined rollouts [35] ──
    def start_ahead(self, parts):
        """Let the policy step start the games' next step (`act_ahead`), `parts` instances of them stepping apart."""
        if self.gym3:  # procgen-gym steps in `step` alone
            self.env = AheadSteps(self.env, parts, self.make_part)

    def act_ahead(self, actions, part=None):
        """Start the next step of the games of `part` (or of all), and return at once; `step` then waits for it."""
        if self.gym3 and isinstance(self.env, AheadSteps):
            self.env.act_ahead(np.asarray(actions, dtype=np.int32), part)

    # ── end folded and pipelined rollouts ──


def make_envs(num_envs, seed, num_levels, start_level, args: Args, video_dir=None):
    """`num_envs` games on `num_levels` levels from `start_level` (0: all)."""
    envs = ProcgenVecEnv(num_envs, seed, video_dir, env_name=args.env_id, distribution_mode=args.distribution_mode,
                         num_levels=num_levels, start_level=start_level, num_threads=args.env_threads)  # fmt: skip
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP  # as `dones` needs
    return envs


# ── folded and pipelined rollouts [35]: the games step while the policy computes ──
class AheadSteps:
    """procgen's gym3 games in `parts` instances, each of whose next step may start (`act_ahead`) before the adapter's
    `step` waits for them all. Parts are made with the games' states copied from the one instance of them all: procgen
    seeds its games in order from one `rand_seed`, so parts seeded apart would play other levels."""

    def __init__(self, whole, parts, make):
        self.size, self.started = whole.num // parts, [False] * parts
        self.parts = [whole] if parts == 1 else [make(num=self.size) for _ in range(parts)]
        if parts > 1:
            self.set_state(whole.get_state())

    def act_ahead(self, actions, part=None):
        """Start the step of one part (`actions` are its own) or of all of them, and return at once."""
        for k in range(len(self.parts)) if part is None else [part]:
            self.parts[k].act(actions if part is not None else actions[k * self.size : (k + 1) * self.size])
            self.started[k] = True

    def act(self, actions):
        """The adapter's step: the parts whose step has not started yet."""
        for k, part in enumerate(self.parts):
            if not self.started[k]:
                part.act(actions[k * self.size : (k + 1) * self.size])
        self.started = [False] * len(self.parts)

    def observe(self):
        seen = [part.observe() for part in self.parts]
        if len(seen) == 1:
            return seen[0]
        rgb = np.concatenate([obs["rgb"] for _, obs, _ in seen])
        return np.concatenate([r for r, _, _ in seen]), {"rgb": rgb}, np.concatenate([f for _, _, f in seen])

    def get_state(self):
        return [state for part in self.parts for state in part.get_state()]

    def set_state(self, states):
        for k, part in enumerate(self.parts):
            part.set_state(states[k * self.size : (k + 1) * self.size])


class RolloutPolicy:
    """One rollout's policy step, the lean loop's `policy_step(agent, next_obs)` (`--rollout plain`), or with
    the test envs folded in: after the training envs' forward pass, the test envs' own, whose actions start those envs'
    step at once, beside the training envs' (`step_test_envs` waits for it). Pipelined, the first half of the training
    envs starts its step while the second half's actions (and the test envs') are computed. Folded or pipelined, the
    noise of the whole rollout is drawn ahead, the training envs' and then the test envs' (from the test loop's own
    generator), in the order in which the plain rollout and the test envs' loop draw it: where the forward pass gives
    an observation the same output in any batch (a CPU), the run logs what `--rollout plain` logs. The training envs'
    forward pass never holds the test envs' observations: a GPU, which may round a batch of another size otherwise,
    trains alike whatever `--eval-interval` and `--num-eval-envs` are."""

    def __init__(self, agent, policy_step, envs, test_envs, test_obs, args: Args, to_device, iteration):
        self.agent, self.policy_step, self.envs = agent, policy_step, envs  # [36] the stage, compiled or not
        self.test_envs, self.test_obs = test_envs, test_obs
        self.to_device, self.t, self.test_episodes, self.noise = to_device, 0, [], None
        self.test_noise = None
        self.size = envs.num_envs // (2 if args.rollout == "pipelined" else 1)
        actions, device = envs.single_action_space.n, next(agent.parameters()).device
        if args.rollout != "plain":
            self.noise = torch.empty((args.num_steps, envs.num_envs, actions), device=device).exponential_()
        if test_envs is not None:  # the test envs' noise after the training envs', in each step's row, from the
            with torch.random.fork_rng([device] if device.type == "cuda" else []):  # plain loop's own generator
                torch.manual_seed(args.seed + 7919 * args.rank + 1_000_003 + iteration)  # [30] each process's own
                shape = (args.num_steps, test_envs.num_envs, actions)
                self.test_noise = torch.empty(shape, device=device).exponential_()

    def __call__(self, next_obs):
        if self.noise is None:
            return self.policy_step(self.agent, next_obs)
        outs, parts = [], len(next_obs) // self.size
        for k in range(parts):
            rows = slice(k * self.size, (k + 1) * self.size)
            outs.append(self.policy_step(self.agent, next_obs[rows], self.noise[self.t, rows]))
            if k < parts - 1:
                self.envs.unwrapped.act_ahead(outs[-1][0].cpu().numpy(), k)
        if self.test_envs is not None:  # a forward pass of their own, started before the training envs wait
            self.test_action = self.policy_step(self.agent, self.test_obs, self.test_noise[self.t])[0].cpu().numpy()
            self.test_envs.unwrapped.act_ahead(self.test_action)
        self.t += 1
        return outs[0] if len(outs) == 1 else [torch.cat(o) for o in zip(*outs, strict=True)]

    def step_test_envs(self):
        """Wait for the test envs' step that the policy step started (folded), and keep the episodes that ended."""
        if self.test_envs is not None:
            test_obs, _, _, _, test_infos = self.test_envs.step(self.test_action)
            self.test_obs = self.to_device("test_obs", test_obs)
            log_episodes(self.test_episodes, test_infos, 0, "test_")


# ── end folded and pipelined rollouts ──


# ── the status line: on a terminal, one line rewritten in place with the progress, the SPS and the time left ──
class StatusLine:
    """Standard output on a terminal, with a status line at the bottom that every printed line first clears."""

    def __init__(self, stream):
        self.stream, self.shown, self.drawn = stream, False, 0.0

    def write(self, text):
        if self.shown and text:
            self.stream.write("\r\033[K")
            self.shown = False
        return self.stream.write(text)

    def show(self, text):
        """Draw `text` as the status line, at most 4 times a second so that the rollout does not wait on it."""
        if time.time() - self.drawn > 0.25:
            with contextlib.suppress(OSError):  # a failing terminal: console() below says nothing more either
                self.stream.write(f"\r\033[K{text}")
                self.stream.flush()
            self.shown, self.drawn = True, time.time()

    def restore(self):
        """Clear the status line; the terminal's own stream, to put back as sys.stdout."""
        if self.shown:
            with contextlib.suppress(OSError):
                self.stream.write("\r\033[K")
        return self.stream

    def __getattr__(self, name):  # flush, isatty, fileno, ...: the terminal's
        return getattr(self.stream, name)


def progress(text, global_step, started, args: Args):
    """On a status line (rank 0's terminal, set up by `train`): `text`, the step, the steps per second since
    `started` (a time and a step) and the time left."""
    if isinstance(sys.stdout, StatusLine):
        total, sps = args.num_iterations * args.batch_size, (global_step - started[1]) / (time.time() - started[0])
        minutes_left = (total - global_step) / max(sps, 1e-6) / 60
        sys.stdout.show(f"{text}  step {global_step}/{total}  SPS {sps:.0f}  {minutes_left:.1f} min left")


# ── end status line ──


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


# ── end RND ──


# ── bf16 autocast [31] ──
def autocast_bf16(module):
    """Run `module` under bf16 autocast; its output goes back to fp32, so every loss and ratio stays in fp32."""
    forward = module.forward

    def forward_bf16(x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return forward(x).float()

    module.forward = forward_bf16
    return module


# ── end bf16 autocast ──


# ── the agent's options [31], [33], [35], [36] ──
def agent_options(agent, envs, test_envs, args: Args):
    """RND [33] and the weights to start from; bf16 autocast [31] of the encoders alone (bf16 heads would round logits
    and values before the ratio; the heads are one small layer each); and [35] the folded or pipelined rollout's
    envs."""
    if args.intrinsic_coef > 0:
        agent.rnd = RND(args.local_num_envs, args.intrinsic_gamma, args.world_size)
    if args.init_model is not None:  # e.g. fine-tuning a pretrained agent: its weights, a fresh optimizer
        load_weights(agent, args.init_model, "init-model")
    for name, module in agent.named_children():
        if name in ("network", "value_network") and args.autocast == "bf16":
            autocast_bf16(module)
    if args.rollout != "plain":
        envs.unwrapped.start_ahead(2 if args.rollout == "pipelined" else 1)
        if test_envs is not None:
            test_envs.unwrapped.start_ahead(1)


# ── end the agent's options ──


# ── torch.compile [36]: the loop's stages, compiled ──
def compiled_stages(names, optimizers, device, args: Args):
    """The stages `train` calls, by their `names`: as they are, or (`--compile`) each compiled whole but the
    advantages. Compiled, the learning rate is a device tensor changed in place (`set_lr`) and on a GPU Adam keeps its
    step counts there too (capturable), so the compiled optimizer step reads both without recompiling or waiting;
    random draws inside a stage come from torch's own generator (inductor's `fallback_random`), so that a compiled run
    draws what an eager one draws; with CUDA graphs (`reduce-overhead`) each call's outputs are copied out of the
    graph's memory, which the next replay reuses"""
    stages = [globals()[name] for name in names]  # the module's, which `train` then rebinds
    if args.compile == "off":
        return stages
    import torch._inductor.config

    torch._inductor.config.fallback_random = True
    capturable = device.type == "cuda"
    for optimizer in {id(o): o for o in optimizers}.values():
        for group in optimizer.param_groups:
            group["lr"], group["capturable"] = torch.tensor(float(group["lr"]), device=device), capturable
        for state in optimizer.state.values():  # a resumed run's step counts, where capturable Adam keeps them
            if "step" in state:
                state["step"] = state["step"].to(device if capturable else "cpu", torch.float32)
        # Adam makes a parameter's state at its first gradient; the compiled step guards on how many there are, so a
        # head that first learns later (PPG's auxiliary head) would compile it again: every state made now, as Adam
        # makes it (zeros, step 0), the same numbers
        for p in (p for group in optimizer.param_groups for p in group["params"] if p not in optimizer.state):
            step = torch.zeros((), dtype=torch.float32, device=device if capturable else "cpu")
            optimizer.state[p] = {"step": step, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}

    def compiled(stage):
        stage = torch.compile(stage, mode=args.compile, dynamic=False)
        if args.compile != "reduce-overhead" or not capturable:
            return stage

        def replay(*stage_args):
            torch.compiler.cudagraph_mark_step_begin()
            out = stage(*stage_args)
            return torch.utils._pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, out)

        return replay

    # the advantages stay eager: compiled, their loop over the rollout's steps unrolls (84 s of cold compile for 256
    # steps on a 2-core CPU) for a call made once an iteration that takes about 12 ms there
    return [stage if stage.__name__ == "compute_gae" else compiled(stage) for stage in stages]


def set_lr(optimizer, lr):
    """Set the learning rate, in place where it is a device tensor (`--compile`): the compiled step keeps its graph"""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


# ── end torch.compile ──


def preprocess(x):
    return x.permute((0, 3, 1, 2)) / 255.0  # "bhwc" -> "bchw", uint8 -> [0, 1]


class Agent(nn.Module):
    def __init__(self, obs_shape, num_actions, feature_dim, init_fn, hidden_dim=0, cnn_channels=(16, 32, 32)):
        super().__init__()
        self.network = impala_cnn(obs_shape, feature_dim, init_fn, cnn_channels)
        # [3] Heads: policy 0.01 (near-uniform first actions), value 1 (normed: both 0.1)
        actor_std, critic_std = (0.1, 0.1) if init_fn == "normed" else (0.01, 1.0)
        head_fn = "orthogonal" if init_fn.endswith("_default") else init_fn
        self.actor = head(feature_dim, hidden_dim, num_actions, actor_std, head_fn)
        self.critic = head(feature_dim, hidden_dim, 1, critic_std, head_fn)

    def get_value(self, x):
        return self.critic(self.network(preprocess(x)))

    def get_action_and_value(self, x, action=None, noise=None):
        hidden = self.network(preprocess(x))
        probs = Categorical(logits=self.actor(hidden), validate_args=False)  # no GPU wait
        if action is None:
            # ── sampling without multinomial's checks [34] ──: `probs.sample()`'s draw (torch.multinomial's exponential
            # race: the same actions, seed for seed) without its validity checks (a dozen small kernels, asserted
            # asynchronously: no wait); [35] `noise` drawn ahead by a folded rollout
            noise = torch.empty_like(probs.probs).exponential_() if noise is None else noise
            action = (probs.probs / noise).argmax(-1)
            # ── end sampling without multinomial's checks ──
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


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


# ── minibatch gathers [8]: rows of bytes ──
def take(x, inds, dim=0):
    """x[inds] (dim 0) or x[:, inds] (dim 1), the same values: one `index_select` of whole rows of bytes, which on a CPU
    gathers a minibatch of frames several times faster than advanced indexing (2048 frames: 2.7 ms against 17.6)"""
    rows = x.reshape(*x.shape[: dim + 1], -1).index_select(dim, inds)
    return rows.view(*x.shape[:dim], len(inds), *x.shape[dim + 1 :])


# ── end minibatch gathers ──


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


def vtrace_part(vtrace, mb_inds, rho_clipped):
    """[28] What a minibatch of whole segments needs for V-trace: its rewards and dones, its segments' bootstrap values
    and dones (the segments are the first step's samples), the values to refresh, its samples, and the clip counter."""
    rewards, dones, next_value, next_done, b_values = vtrace
    segments = mb_inds[: len(mb_inds) * len(next_value) // len(rewards)]  # the samples of the first step
    mb_next = (next_value[segments], next_done[segments])
    return take(rewards, mb_inds), take(dones, mb_inds), *mb_next, b_values, mb_inds, rho_clipped


def weighted_mean(x, weights=None):
    """The mean, or with [29]'s importance weights the weighted mean sum(w x) / n."""
    return x.mean() if weights is None else (weights * x).mean()


# ── end prioritised sampling ──


def update_minibatch(agent, optimizer, mb, args: Args):
    """One minibatch's step; the `stats` (on the device) are logged by name."""
    mb_obs, mb_actions, mb_logprobs, mb_advantages, mb_returns, mb_values, mb_weights, mb_vtrace = mb  # [29], [28]
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
        mb_rewards, mb_dones, mb_next_value, mb_next_done, b_values, mb_inds, rho_clipped = mb_vtrace
        mb_returns = mb_advantages + mb_values
        with torch.no_grad():
            r, v, d, rho = (x.view(args.num_steps, -1) for x in (mb_rewards, mb_values, mb_dones, ratio))  # a column
            clips = (args.vtrace_rho_clip, args.vtrace_c_clip)  # a segment, as in the rollout
            gae = compute_gae(r, v, d, mb_next_value, mb_next_done, args.gamma, args.gae_lambda, rho, *clips)
            mb_advantages = gae[0].view(-1)
            if args.norm_adv:  # [17] Metta normalises each minibatch's V-trace advantages
                mb_mean, mb_std = global_mean_std(mb_advantages, args.world_size)
                mb_advantages = (mb_advantages - mb_mean) / (mb_std + 1e-8)
            rho_clipped.add_((ratio > args.vtrace_rho_clip).float().mean())
            b_values.index_copy_(0, mb_inds, newvalue[:, 0].detach())  # Metta: the buffer's values refreshed
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
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    stats = dict(value_loss=v_loss, policy_loss=pg_loss, entropy=entropy_loss, approx_kl=approx_kl)
    stats |= dict(old_approx_kl=old_approx_kl, clipfrac=clipfrac)
    # ── RND [33]: the predictor learns on a random share of each minibatch ──
    if args.intrinsic_coef > 0:
        share = torch.rand(len(mb_obs), device=mb_obs.device) < args.rnd_update_proportion
        rnd_loss = (agent.rnd.prediction_error(mb_obs) * share).sum() / share.sum().clamp(min=1)
        loss = loss + rnd_loss
        stats["rnd_loss"] = rnd_loss  # logged as losses/rnd_loss
    # ── end RND ──
    optimizer.zero_grad()
    loss.backward()
    all_reduce_grads(agent.parameters(), args.world_size)  # [30]
    # [10] Global gradient-norm clipping, as in CleanRL (OpenAI's PPG code does not clip).
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return {name: value.detach() for name, value in stats.items()}


def log_episodes(episodes, infos, global_step, tag):
    """[11] Keep every episode that ended in a step, not only the first."""
    for i in np.flatnonzero(infos.get("_episode", [])):
        episodes.append((tag, global_step, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))


# ── one event per episode [11] ──
def write_episode(writer, tag, step, r, l):
    """An episode's `charts/{tag}episodic_return` and `..._length` in one event: what two `add_scalar` calls log, in
    half the events. The event writer's thread checksums every event in pure Python and holds the GIL meanwhile: 850
    episodes took 24.8 ms in place of 61.4 (a 2-core EPYC, medians of 5), and short episodes end by the hundred in
    an iteration."""
    values = [Summary.Value(tag=f"charts/{tag}episodic_{k}", simple_value=v) for k, v in (("return", r), ("length", l))]
    writer.file_writer.add_summary(Summary(value=values), step)


# ── end one event per episode ──


# ── pinned copies [34] ──
class ToDevice:
    """The envs' numpy arrays as tensors on the device. On CUDA each goes through its own pinned host buffer and an
    asynchronous copy: the `.cpu()` of the next actions waits for that copy before the envs step and the buffer is
    written again. Elsewhere the tensor shares the array's memory."""

    def __init__(self, device):
        self.device, self.pinned = device, {}

    def __call__(self, key, array, dtype=None):
        if self.device.type != "cuda":
            return torch.as_tensor(array, device=self.device, dtype=dtype)
        host = torch.as_tensor(array, dtype=dtype)
        if key not in self.pinned:  # an env's arrays keep their shape and dtype
            self.pinned[key] = torch.empty_like(host).pin_memory()
        return self.pinned[key].copy_(host).to(self.device, non_blocking=True)


# ── end pinned copies ──


# ── torchrun [30]: data parallelism, one flattened all-reduce of the gradients per step, global statistics ──
def init_process_group(backend):
    """Join the process group. Under torchrun the agent's store outlives a restart, keys and all: each round
    rendezvouses under its own prefix, so a restarted process never dials the address of a dead one."""
    # torch._dynamo first (Adam imports it): imported after the group is made, it holds references to it, which keep
    # gloo's threads alive past destroy_process_group; one of them may then abort the process as Python exits
    import torch._dynamo  # noqa: F401

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return dist.init_process_group(backend)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store = dist.PrefixStore(f"round_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)
    dist.init_process_group(
        backend, store=store, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"])
    )


def all_reduce_grads(params, world_size):
    """Average the gradients over the processes, in one all-reduce of all of them flattened together."""
    if world_size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def global_mean_std(x, world_size):
    """The mean and the (unbiased) std of `x` over the batches of all processes together."""
    if world_size == 1:
        return x.mean(), x.std()
    stats = torch.stack([x.sum(), (x * x).sum(), torch.tensor(float(x.numel()), device=x.device)]).double()
    dist.all_reduce(stats)
    total, total_sq, n = stats
    mean = total / n
    return mean.to(x.dtype), ((total_sq - n * mean**2) / (n - 1)).clamp(min=0).sqrt().to(x.dtype)


def rank_reduce(values, world_size, mean=True):
    """Per-process floats (a list) reduced over the processes: their mean, or (mean=False) their maximum."""
    if world_size == 1:
        return values
    values = [float(v) for v in values]  # numbers, or one-number tensors ([36] a compiled run's learning rate)
    tensor = torch.tensor(values, dtype=torch.float64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if mean else dist.ReduceOp.MAX)
    return (tensor / world_size if mean else tensor).tolist()


def gather_objects(obj, world_size, everywhere=True):
    """Every process's `obj` in a list: on every process, or (everywhere=False) on rank 0 only."""
    if world_size == 1:
        return [obj]
    out = [None] * world_size if everywhere or dist.get_rank() == 0 else None
    if everywhere:
        dist.all_gather_object(out, obj)
    else:
        dist.gather_object(obj, out, dst=0)
    return out


def leave_processes(agent, writer, global_step, args: Args):
    """At the end of a run under torchrun: log the largest difference between any process's weights and rank 0's
    (0 when all is well), and leave the process group."""
    if args.world_size > 1:
        flat = torch.cat([p.detach().reshape(-1) for p in agent.parameters()])  # channels-last ones too
        reference = flat.clone()
        dist.broadcast(reference, src=0)
        max_diff = rank_reduce([(flat - reference).abs().max().item()], args.world_size, mean=False)[0]
        writer.add_scalar("charts/ranks_max_param_diff", max_diff, global_step)
        dist.destroy_process_group()


class NullWriter:
    """The TensorBoard writer of processes other than rank 0: they log nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    @property
    def file_writer(self):  # `writer.file_writer.add_summary(...)` does nothing either
        return self


def join_processes(args: Args, device):
    """Under torchrun, join the process group; rank 0 alone prints. Every process, and every restart of the job,
    agrees on the run's name, and a restarted job continues its run from the newest checkpoint. A new run gets a
    directory that no other run has (made by rank 0, `_2`, `_3`, ... where other runs started in the same second or
    share a named job's name); a named job's first attempt marks it as its own (`torchrun_job`: the job's name, and
    the machine and torchrun agent of rank 0), and a restart of that job, and only it, finds it by that mark."""
    if args.world_size > 1:
        init_process_group(args.backend or ("nccl" if device.type == "cuda" else "gloo"))
        if args.rank > 0:  # one process speaks for all
            sys.stdout = open(os.devnull, "w")
    job = os.environ.get("TORCHELASTIC_RUN_ID", "none")  # torchrun's "none": no --rdzv-id, no --standalone
    stamp = job if job != "none" else gather_objects(int(time.time()), args.world_size)[0]  # rank 0's clock
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{stamp}"
    owner = f"{job} {socket.gethostname()} {os.getppid()}\n"  # torchrun's agent, the workers' parent, outlives restarts
    restarted, found = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0, None
    if restarted and args.resume is not None:  # from the newest checkpoint of the run that --resume continued
        ckpt = load_checkpoint(args.resume, "resume")[1]
        found = ckpt.get("run_name", run_name) if isinstance(ckpt, dict) else run_name
    elif restarted and job != "none":  # the directory that this job's first attempt made, if it got that far
        dirs = sorted(glob.glob(f"runs/{glob.escape(run_name)}*"))
        mine = [d for d in dirs if read_text(f"{d}/torchrun_job") == owner]
        found = gather_objects(os.path.basename(mine[0]) if mine and args.rank == 0 else None, args.world_size)[0]
    elif restarted:
        console("torchrun restarted the job, which has no name to find its run by (--rdzv-id or --standalone gives "
                "it one): it starts anew")  # fmt: skip
    if found is not None and glob.glob(f"runs/{found}/checkpoints/iter_*.pt"):
        args.resume = f"runs/{found}"
    if args.resume is None and found is None:  # a new run: a directory of its own
        made = make_dir(f"runs/{run_name}", "exp-name", new=True) if args.rank == 0 else None
        if made is not None and job != "none":
            with open(f"{made}/torchrun_job", "w") as f:
                f.write(owner)
        run_name = os.path.basename(gather_objects(made, args.world_size)[0])
    return found or run_name


def read_text(path):
    """A small file's text, or None where there is none."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


# ── end torchrun ──


# ── checkpoints [25]: everything a run needs to continue exactly, procgen's games included, written atomically ──
def env_state(envs):
    """Procgen's game states (exact: its level generator too) and the statistics of every wrapper around it."""
    state, env = [], envs
    while isinstance(env, gym.vector.VectorWrapper):
        kept = (np.ndarray, deque, gym.wrappers.utils.RunningMeanStd, int, float)
        state.append({k: copy.deepcopy(v) for k, v in vars(env).items() if isinstance(v, kept)})
        env = env.env
    return {"wrappers": state, "procgen": env.env.get_state(), "video_episode": env.video_episode}


def set_env_state(envs, state):
    env = envs
    for wrapper_state in state["wrappers"]:
        vars(env).update(copy.deepcopy(wrapper_state))
        env = env.env
    env.env.set_state(state["procgen"])
    env.video_episode = state["video_episode"]


def rng_state(device):
    """The random states, the GPU's of this process alone: a resume may see other GPUs, or fewer."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state, device):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def plain(value):
    """`value` in the types that `torch.load(weights_only=True)` reads, which runs no code from the file: numpy arrays
    as tensors, queues as lists, running statistics as dicts; `unplain` turns them back."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": torch.from_numpy(value.copy())}
    if isinstance(value, np.generic):  # a numpy scalar: its Python number
        return value.item()
    if isinstance(value, deque):
        return {"__deque__": [plain(v) for v in value], "maxlen": value.maxlen}
    if isinstance(value, gym.wrappers.utils.RunningMeanStd):
        return {"__running_mean_std__": plain(vars(value))}
    if isinstance(value, dict):
        return {key: plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def unplain(value):
    if isinstance(value, dict) and "__ndarray__" in value:
        return value["__ndarray__"].numpy()
    if isinstance(value, dict) and "__deque__" in value:
        return deque(unplain(value["__deque__"]), maxlen=value["maxlen"])
    if isinstance(value, dict) and "__running_mean_std__" in value:
        rms = gym.wrappers.utils.RunningMeanStd()
        vars(rms).update(unplain(value["__running_mean_std__"]))
        return rms
    if isinstance(value, dict):
        return type(value)((key, unplain(v)) for key, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(unplain(v) for v in value)
    return value


class WholeWrites:
    """An unbuffered file whose every write is whole, or an OSError with the system's reason (a full disk, a quota):
    `torch.save` would take a short write for a broken archive and say only that."""

    def __init__(self, file):
        self.file = file

    def write(self, data):
        view = memoryview(data).cast("B")
        while view:
            view = view[self.file.write(view) :]
        return len(data)

    def flush(self):  # unbuffered: nothing waits
        pass


NOT_WRITTEN = {}  # by run directory, what the run was asked to write and could not: {"checkpoint": path, "model": path}


def what_is_kept(run_dir):
    """The newest checkpoint of the run on disk (each is written whole or not at all) and its iteration, in words."""
    found = sorted(glob.glob(f"{run_dir}/checkpoints/iter_*.pt"))
    if not found:
        return "no checkpoint of this run exists yet"
    return f"the newest checkpoint kept is {found[-1]} (iteration {int(os.path.basename(found[-1])[5:13])})"


def model_not_written(model_path, exc):
    """`--save-model`'s write failed: one line, and the end of the run exits with status 4 (exit_unless_kept). A run
    directory that is gone is not a full disk: the error goes on to keeps_process_settings."""
    if removed_run_dir(exc):
        raise exc
    print(f"{SCRIPT}.py: error: {model_path} not written: {exc.strerror}; the logs beside it are kept",
          file=sys.stderr, flush=True)  # fmt: skip
    NOT_WRITTEN.setdefault(os.path.dirname(model_path), {})["model"] = model_path


def exit_unless_kept(run_dir):
    """A run that ends without its last checkpoint or its model file written exits with status 4, its last line
    saying what is on disk: a scheduler or a sweep that reads the status must not take it for a run to resume or use."""
    missed = NOT_WRITTEN.pop(run_dir, {})
    if "checkpoint" in missed:
        found = sorted(glob.glob(f"{run_dir}/checkpoints/iter_*.pt"))
        then = f"resume with: python {SCRIPT}.py --resume {found[-1]}" if found else "the run cannot be resumed"
        print(f"{SCRIPT}.py: error: the run ended without its last checkpoint, {missed['checkpoint']}; "
              f"{what_is_kept(run_dir)}: {then}", file=sys.stderr, flush=True)  # fmt: skip
    if missed:
        raise SystemExit(4)


def save_checkpoint(run_dir, name, state, keep=None, kept=None):
    """Write to a temporary file, flush it to disk, then rename: a kill at any moment leaves the old files whole. A
    write that fails (a full disk, a quota) removes its temporary file, says why in one line and returns None. Then
    the `keep` newest are kept: of the checkpoints written before this one (whose names sort before it: a resume set
    the newer ones aside), the oldest go, never this one nor `kept`, the checkpoint the run resumed from."""
    path = f"{run_dir}/checkpoints/{name}"
    if not os.path.isdir(run_dir):  # removed mid-run: not made again (keeps_process_settings stops the run)
        raise FileNotFoundError(errno.ENOENT, "the run directory is gone", run_dir)
    try:  # straight into the file, not through a copy in memory: PPG's phase buffer may be 6 GiB
        os.makedirs(f"{run_dir}/checkpoints", exist_ok=True)
        with open(path + ".tmp", "wb", buffering=0) as f:
            torch.save(plain(state), WholeWrites(f))
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
    except (OSError, RuntimeError) as error:
        exc = error if isinstance(error, OSError) else error.__context__  # torch's archive error hides the system's
        if not isinstance(exc, OSError):
            raise
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")
        if name.startswith("iter_"):  # what the end of the run reports (exit_unless_kept)
            NOT_WRITTEN.setdefault(run_dir, {})["checkpoint"] = path
        print(f"{SCRIPT}.py: warning: {path} not written: {exc.strerror or exc}; {what_is_kept(run_dir)}",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    if name.startswith("iter_"):
        NOT_WRITTEN.get(run_dir, {}).pop("checkpoint", None)
    older = [p for p in sorted(glob.glob(f"{run_dir}/checkpoints/iter_*.pt")) if os.path.basename(p) < name]
    for old in older[: max(len(older) - keep + 1, 0) if keep else 0]:
        if not (kept and os.path.exists(kept) and os.path.samefile(old, kept)):
            os.remove(old)
    return path


LOADED = {}  # the last checkpoint read, by path, time and size


def read_checkpoint(path):
    """A checkpoint file's contents, read from disk once (`--resume` reads its flags first, then its state); a
    ValueError saying why a file is not a readable checkpoint."""
    key = (os.path.abspath(path), os.stat(path).st_mtime_ns, os.stat(path).st_size)
    if key in LOADED:
        return LOADED[key]
    LOADED.clear()  # one checkpoint in memory at a time: PPG's may hold a 6 GiB phase buffer
    try:  # tensors and plain Python values only: a file that would run code on loading is refused
        LOADED[key] = unplain(torch.load(path, map_location="cpu", weights_only=True, mmap=True))
    except Exception as exc:  # a truncated or foreign file fails somewhere in torch's zip or pickle layers
        why = "holds more than tensors and plain values" if isinstance(exc, pickle.UnpicklingError) else "truncated?"
        raise ValueError(f"not a readable checkpoint ({why}: {type(exc).__name__})") from exc
    return LOADED[key]


def load_checkpoint(path, flag):
    """A checkpoint file, or the newest `iter_*.pt` of a run directory that reads (a warning names each newer one that
    does not: a copy cut short, a disk that lost its tail); a one-line error for anything else."""
    if os.path.isdir(path):
        found = sorted(glob.glob(f"{path}/checkpoints/iter_*.pt") + glob.glob(f"{path}/iter_*.pt"))
        if not found:
            arg_error(flag, f"{path}: no checkpoint (checkpoints/iter_*.pt) in this run directory")
        for newer in found[:0:-1]:  # newest first; the oldest is read as a file named by the flag would be
            try:
                return newer, read_checkpoint(newer)
            except ValueError as why:
                if newer not in SKIPPED:  # `--resume` looks twice: one warning
                    SKIPPED.add(newer)
                    print(f"{SCRIPT}.py: warning: --{flag}: {newer}: skipped, {why}", file=sys.stderr, flush=True)
        path = found[0]
    if path.endswith(".tmp"):  # a write that a second signal or a crash cut short: never a checkpoint
        arg_error(flag, f"{path}: an unfinished checkpoint write, not a checkpoint")
    if not os.path.isfile(path):
        arg_error(flag, f"{path}: no such file")
    try:
        return path, read_checkpoint(path)
    except ValueError as why:
        arg_error(flag, f"{path}: {why}")


SKIPPED = set()  # the unreadable checkpoints of a run directory that a warning named


def check_checkpoint(path, ckpt, args: Args, flags, flag):
    """Refuse a checkpoint of the other script, or one whose network or rollout sizes differ, naming what differs."""
    if not isinstance(ckpt, dict) or "args" not in ckpt:
        arg_error(flag, f"{path}: not a checkpoint of these scripts")
    if ckpt.get("script") != SCRIPT:
        arg_error(flag, f"{path}: written by {ckpt.get('script')}.py, not {SCRIPT}.py")
    for key in flags:
        # a flag newer than the checkpoint: the default that the checkpoint's run had
        saved = ckpt["args"].get(key, Args.__dataclass_fields__[key].default)
        if saved != getattr(args, key):
            shown = [" ".join(map(str, v)) if isinstance(v, tuple) else v for v in (saved, getattr(args, key))]
            arg_error(flag, f"{path}: made with --{key.replace('_', '-')} {shown[0]}, this run has {shown[1]}")


def resume_checkpoint(args: Args):
    """`--resume`: the checkpoint, checked against this run's flags and processes; None without `--resume`."""
    if args.resume is None:
        return None
    path, ckpt = load_checkpoint(args.resume, "resume")
    check_checkpoint(path, ckpt, args, NETWORK_FLAGS + ROLLOUT_FLAGS, "resume")
    if ckpt.get("diagnostic"):
        arg_error("resume", f"{path}: a diagnostic checkpoint of a diverged run; resume from an iter_*.pt")
    if (ckpt["args"]["intrinsic_coef"] > 0) != (args.intrinsic_coef > 0):  # [33] RND's weights and Adam's state
        arg_error("intrinsic-coef", f"{path}: made with --intrinsic-coef {ckpt['args']['intrinsic_coef']}; RND must be "
                  "on in both runs or off in both", args.intrinsic_coef)  # fmt: skip
    if len(ckpt["ranks"]) != args.world_size:
        arg_error("resume", f"{path}: made by {len(ckpt['ranks'])} processes, this run has {args.world_size}")
    return {**ckpt, "path": path}


HELD = []  # the run directories' lock files that this process holds: closed, and so released, when `train` ends


def hold_run(run_dir, args: Args):
    """One run at a time in a run directory: rank 0 holds an flock on `run_dir/lock` while the run lives, and a second
    run that would write there (the same `--resume` sent twice, a job requeued while its first copy runs) stops in one
    line. The system releases the lock when its process dies: a crashed run leaves nothing that blocks."""
    busy = None
    if args.rank == 0:
        f = open(f"{make_dir(run_dir, 'exp-name')}/lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            f.truncate(0)
            f.write(f"{socket.gethostname()} {os.getpid()}\n")
            f.flush()
            HELD.append(f)
        except OSError:  # held by another process
            f.seek(0)
            busy = f.read().strip() or "unknown"
            f.close()
    busy = gather_objects(busy, args.world_size)[0]  # every process stops, not rank 0 alone
    if busy is not None:
        arg_error("resume", f"{run_dir}: in use by a run that is still going (machine and process: {busy}); "
                  "stop it first, or resume a copy of the directory")  # fmt: skip


def set_aside_newer(ckpt, run_dir):
    """Rank 0, holding the run: a `*.tmp` that a write cut short (a second signal, a crash) left goes; a resume from a
    checkpoint older than its run's newest abandons the newer ones (and any that did not read), which move to
    `checkpoints/abandoned/`, so that rotation, a later `--resume RUN_DIR` and a torchrun restart all follow the line
    that goes on from here."""
    for tmp in glob.glob(f"{glob.escape(run_dir)}/checkpoints/*.tmp"):
        os.remove(tmp)
    found = sorted(glob.glob(f"{glob.escape(run_dir)}/checkpoints/iter_*.pt")) if ckpt else []
    newer = [p for p in found if os.path.basename(p) > checkpoint_name(ckpt["iteration"], ckpt.get("aux_epoch", 0))]
    if newer:
        aside = make_dir(f"{run_dir}/checkpoints/abandoned", "resume", new=True)
        for path in newer:
            os.replace(path, f"{aside}/{os.path.basename(path)}")
        print(f"{SCRIPT}.py: warning: --resume: {ckpt['path']} is older than {len(newer)} checkpoint(s) of its "
              f"run, now in {aside}/; the run goes on from iteration {ckpt['iteration']}", file=sys.stderr)  # fmt: skip


def load_weights(agent, path, flag):
    """Load a checkpoint's or a saved model's weights; RND's may be missing or extra (fine-tuning after
    pretraining drops it); anything else that does not fit is a one-line error naming the file."""
    path, weights = load_checkpoint(path, flag)
    weights = weights["model"] if isinstance(weights, dict) and "model" in weights else weights
    own = agent.state_dict()  # RND's per-env state is sized by the process count of its run: not carried over
    if isinstance(weights, dict):
        weights = {
            k: v for k, v in weights.items() if not k.startswith("rnd.") or getattr(own.get(k), "shape", 0) == v.shape
        }
    try:
        missing, unexpected = agent.load_state_dict(weights, strict=False)
    except (RuntimeError, TypeError, AttributeError) as exc:
        problem = str(exc).strip().splitlines()[-1].strip()
        arg_error(flag, f"{path}: the weights do not fit this network ({problem[:200]})")
    other = [k for k in missing + unexpected if not k.startswith("rnd.")]
    if other:
        arg_error(flag, f"{path}: the weights do not fit this network (keys {', '.join(other[:3])} ...)")
    return path


def restore_run(ckpt, agent, optimizer, envs, test_envs, recent, device, args: Args, aux_optimizer=None):
    """Continue exactly where `ckpt` stopped: the weights, the optimizers (a separate auxiliary one starts afresh if
    the checkpoint has none), this process's games with their wrappers' statistics, its random states, and the
    console's averages. This process's part of the checkpoint, whose next observations (and PPG's phase so far) the
    caller takes back."""
    agent.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    if aux_optimizer is not None and aux_optimizer is not optimizer and ckpt.get("aux_optimizer") is not None:
        aux_optimizer.load_state_dict(ckpt["aux_optimizer"])
    lr = args.learning_rate * (1.0 - (ckpt["iteration"] - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
    for opt in (optimizer, aux_optimizer or optimizer):
        for group in opt.param_groups:  # Adam's saved settings give way to the flags (the checkpoint's, or given)
            # [16] the rate of the checkpoint's iteration (whose auxiliary phase a PPG resume may finish first); not
            # capturable, as a compiled GPU run's was: compiled_stages sets it again where this run compiles
            group["lr"], group["eps"], group["capturable"] = lr, args.adam_eps, False
    mine = ckpt["ranks"][args.rank]  # what belongs to this process: its envs and random states
    set_env_state(envs, mine["envs"])
    if mine.get("intrinsic_return") is not None:  # [33] this process's envs' running returns, not rank 0's
        agent.rnd.intrinsic_return.copy_(mine["intrinsic_return"])
    if test_envs is not None and mine["test_envs"] is not None:
        set_env_state(test_envs, mine["test_envs"])
    set_rng_state(mine["rng"], device)
    for returns, key in zip(recent, ("recent_returns", "recent_test_returns"), strict=True):
        returns.extend(ckpt.get(key, []))  # the console's averages go on as if never stopped
    console(f"resumed from {ckpt['path']}: iteration {ckpt['iteration']}, step {ckpt['global_step']}")
    return mine


def write_checkpoint(run_name, iteration, global_step, agent, optimizers, mine, given, recent, args: Args, aux_epoch=0):
    """The run's state after `iteration` (and `aux_epoch` epochs of its auxiliary phase): the weights, the optimizers
    (the policy phase's, and the auxiliary phase's where it has its own) and every process's own part (`mine`: its
    games, random states, ...), gathered and written by rank 0. Its path; None where it could not be written (the
    warning said why, and the next checkpoint tries again) or on the other ranks. Inside an auxiliary phase,
    `iter_N.auxEEE.pt` sorts before `iter_N.pt`, and after `iter_N-1.pt`."""
    ranks = gather_objects(mine, args.world_size, everywhere=False)
    if args.rank > 0:
        return None
    state = {
        "script": SCRIPT, "args": given, "run_name": run_name, "iteration": iteration, "global_step": global_step,
        "model": agent.state_dict(), "optimizer": optimizers[0].state_dict(), "ranks": ranks,
        "aux_optimizer": optimizers[-1].state_dict() if optimizers[-1] is not optimizers[0] else None,
        "recent_returns": list(recent[0]), "recent_test_returns": list(recent[1]), "aux_epoch": aux_epoch,
    }  # fmt: skip
    path = save_checkpoint(f"runs/{run_name}", checkpoint_name(iteration, aux_epoch), state, args.keep_checkpoints,
                           args.resume)  # fmt: skip
    if path is not None:
        console(f"checkpoint: {path}")
    return path


def checkpoint_name(iteration, aux_epoch=0):
    """`iter_N.pt` after iteration N; inside its auxiliary phase `iter_N.auxEEE.pt`, which sorts before `iter_N.pt`
    and after `iter_N-1.pt`: the names sort in the order a run writes them."""
    return f"iter_{iteration:08d}.aux{aux_epoch:03d}.pt" if aux_epoch else f"iter_{iteration:08d}.pt"


def stopped_by_signal(signum, where, ckpt_path, args: Args):
    """Say where (`iteration N`, ...) a run stopped by a signal (STOP_SIGNALS) is, and how to resume it; the exit
    status, 128 + the signal."""
    name = signal.Signals(signum).name
    if args.rank == 0 and ckpt_path is None:
        console(f"stopped by {name} after {where}; no checkpoint was written")
    elif args.rank == 0:
        console(f"stopped by {name} after {where}, checkpoint {ckpt_path}\n"
                f"resume with: python {SCRIPT}.py --resume {ckpt_path}")  # fmt: skip
    return 128 + signum


def diverged(agent, losses, last_good, run_name, iteration, given, args: Args):
    """[26] Whether a loss or a parameter is not finite on any process; if so, rank 0 writes the weights from before
    this iteration as a diagnostic checkpoint and says which quantity went bad."""
    watched = {**losses, **dict(agent.named_parameters())}
    finite = torch.stack([torch.isfinite(value).all() for value in watched.values()]).tolist()  # one wait, not one each
    bad = next((key for key, ok in zip(watched, finite, strict=True) if not ok), None)
    bad = next((b for b in gather_objects(bad, args.world_size) if b is not None), None)  # stop together
    if bad is not None and args.rank == 0:
        diagnostic = {**last_good, "script": SCRIPT, "args": given, "diagnostic": True}
        path = save_checkpoint(f"runs/{run_name}", f"diverged_iter_{iteration:08d}.pt", diagnostic)
        where = f"are in {path}" if path else "could not be written"
        print(f"{SCRIPT}.py: diverged at iteration {iteration}: {bad} is not finite; the weights from before this "
              f"iteration {where}; earlier checkpoints are untouched", file=sys.stderr)  # fmt: skip
    return bad is not None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal or the ssh connection is gone


class GracefulStop:
    """SIGINT, SIGTERM, SIGHUP: finish the iteration, write a checkpoint and exit; a second signal exits at once."""

    def __init__(self):
        self.signum = None
        for s in STOP_SIGNALS:  # put back when `train` ends (keeps_process_settings)
            signal.signal(s, self.handle)

    def handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signum is not None:
            with contextlib.suppress(OSError):  # a terminal that is gone (SIGHUP) takes no more lines
                print(f"\n{name} again: exiting now, without a checkpoint", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signum = signum
        with contextlib.suppress(OSError):
            print(f"\n{name}: finishing this iteration or auxiliary epoch, then writing a checkpoint ({name} again "
                  "exits at once)", file=sys.stderr, flush=True)  # fmt: skip


def cli_defaults(argv):
    """With `--resume` or `--eval-only` a checkpoint, its run's flags become the defaults: flags given still win."""
    for flag in ("--resume", "--eval-only"):
        for i, arg in enumerate(argv):
            path = argv[i + 1] if arg == flag and i + 1 < len(argv) else None
            path = arg.split("=", 1)[1] if arg.startswith(flag + "=") else path
            if path is not None and path.strip():  # a blank path: its rule says so, in check_args
                ckpt = load_checkpoint(path, flag[2:])[1]
                other = ckpt.get("script", SCRIPT) if isinstance(ckpt, dict) and "args" in ckpt else SCRIPT
                if other != SCRIPT:  # before its flags meet this script's rules
                    arg_error(flag[2:], f"{path}: written by {other}.py, not {SCRIPT}.py: python {other}.py {flag} "
                              f"{path}")  # fmt: skip
                if isinstance(ckpt, dict) and ckpt.get("script") == SCRIPT and "args" in ckpt:
                    start_only = ("resume", "eval_only", "init_model")  # how that run began, not how it goes on
                    saved = {k: v for k, v in ckpt["args"].items() if k not in start_only}
                    return Args(**{k: v for k, v in saved.items() if k in Args.__dataclass_fields__})
    return None


# ── end checkpoints ──


# ── evaluation of a saved agent [27]: the first episodes of every env, so that short episodes are not favoured ──
def evaluate(agent, envs, num_episodes, device):
    """Returns of `num_episodes` episodes: env i plays its first quota[i] of them, whatever their lengths."""
    quota = np.full(envs.num_envs, num_episodes // envs.num_envs)
    quota[: num_episodes % envs.num_envs] += 1
    finished, returns = np.zeros(envs.num_envs, dtype=int), []
    next_obs = torch.as_tensor(envs.reset()[0], device=device)
    while (finished < quota).any():
        with torch.no_grad():
            action = agent.get_action_and_value(next_obs)[0]
        next_obs, _, _, _, infos = envs.step(action.cpu().numpy())
        next_obs = torch.as_tensor(next_obs, device=device)
        for i in np.nonzero(infos.get("_episode", []))[0]:
            if finished[i] < quota[i]:
                returns.append(float(infos["episode"]["r"][i]))
                finished[i] += 1
    return returns


def evaluate_saved(args: Args):
    """`--eval-only PATH`: load a checkpoint or a `--save-model` file and report its episodic returns."""
    path, ckpt = load_checkpoint(args.eval_only, "eval-only")
    if isinstance(ckpt, dict) and "model" in ckpt:
        check_checkpoint(path, ckpt, args, NETWORK_FLAGS, "eval-only")
    agent = Agent((64, 64, 3), 15, init_fn=args.init_fn, **{flag: getattr(args, flag) for flag in NETWORK_FLAGS})
    load_weights(agent, path, "eval-only")
    device = torch.device(args.device)
    agent = agent.to(device)
    torch.manual_seed(args.seed)  # one seed, one result
    levels = (args.num_levels, args.start_level) if args.eval_train_levels else (0, 0)
    video_dir = None
    if args.capture_video:
        video_dir = make_dir(
            f"videos/{args.env_id}__{args.exp_name}__eval__{args.seed}__{int(time.time())}", "capture-video"
        )
    envs = make_envs(min(args.num_eval_envs, args.eval_episodes), args.seed + 2_000_003, *levels, args, video_dir)
    returns = evaluate(agent, envs, args.eval_episodes, device)
    envs.close()
    where = "training" if args.eval_train_levels else "test"
    console(f"{path}: episodic return {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} {where} "
            "episodes")  # fmt: skip
    return returns


# ── end evaluation ──


# ── process-wide settings: put back when `train` returns or raises, so that calling it twice starts clean ──
def removed_run_dir(exc):
    """`runs/NAME` where an OSError's file lies in a run directory that no longer exists (removed mid-run), or None."""
    parts = os.fsdecode(exc.filename or "").split(os.sep)
    gone = len(parts) > 1 and parts[0] == "runs" and not os.path.isdir(f"runs/{parts[1]}")
    return f"runs/{parts[1]}" if gone else None


def quiet_event_writer(hook):
    """A `threading.excepthook` silent on TensorBoard's writer thread's OSError (a removed run directory): the main
    thread meets the same error at its next write, and says it in one line."""

    def excepthook(failed):
        if not (isinstance(failed.exc_value, OSError) and type(failed.thread).__name__ == "_AsyncWriterThread"):
            hook(failed)

    return excepthook


def keeps_process_settings(train):
    """The console (the status line's or a silent rank's `sys.stdout`), the stop signals' handlers, torch.distributions'
    argument checks and threads' exception hook, as they were before `train`; a run directory removed mid-run stops
    the run in one line, exit status 5. A process started with its standard output closed (`>&-`, as some schedulers
    start jobs; Python's `sys.stdout` is then None) runs silently: /dev/null takes descriptor 1 before any file the
    run opens could, where a library's own prints would land."""

    @functools.wraps(train)
    def wrapper(*args, **kwargs):
        stdout, handlers = sys.stdout, {s: signal.getsignal(s) for s in STOP_SIGNALS}
        if stdout is None:
            null = os.open(os.devnull, os.O_WRONLY)
            if null != 1:
                os.dup2(null, 1)
                os.close(null)
            sys.stdout = open(1, "w", closefd=False)  # closed as a silent rank's is, when `train` ends
        validate, thread_hook = torch.distributions.Distribution._validate_args, threading.excepthook
        threading.excepthook = quiet_event_writer(thread_hook)
        try:
            return train(*args, **kwargs)
        except FileNotFoundError as exc:
            if removed_run_dir(exc) is None:
                raise
            print(f"{SCRIPT}.py: error: {removed_run_dir(exc)} was removed while the run went on, and its logs and "
                  "checkpoints with it; stopped, nothing made again", file=sys.stderr, flush=True)  # fmt: skip
            raise SystemExit(5) from None
        finally:
            threading.excepthook = thread_hook
            NOT_WRITTEN.clear()
            if isinstance(sys.stdout, StatusLine):  # the status line ends with the run
                sys.stdout.restore()
            elif sys.stdout is not stdout:  # a silent rank's
                sys.stdout.close()
            sys.stdout = stdout
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            torch.distributions.Distribution.set_default_validate_args(validate)
            while HELD:  # the run directory's lock
                HELD.pop().close()

    return wrapper


@keeps_process_settings
# ── end process-wide settings ──
def train(args: Args):
    given = dataclasses.asdict(args)  # the flags as given: checkpoints keep them, `--resume` makes them the defaults
    check_args(args)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.tune_malloc:
        tune_allocator()  # [12] speed only
    # ── divergence guard [26]: a non-finite network output must reach the guard, not raise in torch.distributions ──
    torch.distributions.Distribution.set_default_validate_args(False)
    # ── end divergence guard ──
    # ── evaluation [27] ──
    if args.eval_only is not None:
        return evaluate_saved(args)
    # ── end evaluation ──
    device = torch.device(args.device)
    # ── torchrun [30] ──
    run_name = join_processes(args, device)
    # ── end torchrun ──
    # ── checkpoints [25]: resume ──
    ckpt = resume_checkpoint(args)
    run_name = ckpt["run_name"] if ckpt else run_name
    hold_run(f"runs/{run_name}", args)  # released when `train` ends, or the process
    if ckpt and ckpt["iteration"] >= args.num_iterations:  # nothing left to do: say so, and write nothing
        console(f"runs/{run_name} is complete: {ckpt['iteration']} of {args.num_iterations} iterations, "
                f"{ckpt['global_step']} steps; to extend it: python {SCRIPT}.py --resume runs/{run_name} "
                f"--total-timesteps {2 * args.total_timesteps}")  # fmt: skip
        return run_name
    if args.rank == 0:
        set_aside_newer(ckpt, f"runs/{run_name}")
    args.resume = ckpt["path"] if ckpt else None  # the checkpoint itself, which rotation keeps
    # ── end resume ──
    if args.track and args.rank == 0:
        import wandb

        kwargs = dict(project=args.wandb_project_name, entity=args.wandb_entity, name=run_name)
        wandb.init(**kwargs, sync_tensorboard=True, config=vars(args), monitor_gym=True, save_code=True)
    # on resume, the log continues: events after the checkpoint's step, left by the interrupted run, are dropped (all
    # of them where a restarted torchrun job starts anew in its directory, having no checkpoint)
    purge_step = ckpt["global_step"] + 1 if ckpt else 0
    writer = (
        SummaryWriter(make_dir(f"runs/{run_name}", "exp-name"), purge_step=purge_step, max_queue=1000)
        if args.rank == 0
        else NullWriter()
    )
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
    # ── the console: what runs where ──
    console(f"{SCRIPT}.py: {args.env_id}, {args.num_iterations} iterations of {args.batch_size} steps on {device}; "
            f"logs in runs/{run_name} (tensorboard --logdir runs)")  # fmt: skip
    # ── end the console ──

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed + args.rank)  # [30] each process shuffles its own minibatches
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.benchmark = not args.torch_deterministic

    # env setup: [13] the training levels; test envs on all levels
    env_seed = args.seed + 7919 * args.rank  # [30] every process plays its own levels
    envs = make_envs(args.local_num_envs, env_seed, args.num_levels, args.start_level, args)
    if args.norm_reward:  # [14] divided by the discounted return's std, clipped
        envs = gym.wrappers.vector.NormalizeReward(envs, gamma=args.norm_reward_gamma or args.gamma)
        envs = gym.wrappers.vector.TransformReward(envs, lambda r: np.clip(r, -args.clip_reward, args.clip_reward))
    if args.eval_interval > 0:
        video_dir = make_dir(f"videos/{run_name}", "capture-video") if args.capture_video and args.rank == 0 else None
        test_envs = make_envs(args.num_eval_envs // args.world_size, env_seed + 1_000_003, 0, 0, args, video_dir)
        test_obs = torch.as_tensor(test_envs.reset()[0], device=device)

    agent = Agent(envs.single_observation_space.shape, envs.single_action_space.n, args.feature_dim, args.init_fn,
                  args.hidden_dim, args.cnn_channels)  # fmt: skip
    # ── the agent's options [31], [33], [35], [36] ──
    agent_options(agent, envs, test_envs if args.eval_interval > 0 else None, args)
    # ── end the agent's options ──
    agent = agent.to(device, memory_format=torch.channels_last)  # NHWC, as the frames
    # ── torchrun [30]: the same starting weights everywhere, but each process samples its own actions ──
    if args.world_size > 1:
        for p in agent.parameters():
            dist.broadcast(p.data, src=0)
        torch.manual_seed(args.seed + args.rank)
    # ── end torchrun ──
    # [15] Adam epsilon 1e-5 as in PPO2 and CleanRL (OpenAI's PPG code: 1e-8)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)

    # ALGO Logic: Storage setup; observations stay uint8
    obs = torch.zeros((args.num_steps, *envs.observation_space.shape), dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, envs.num_envs), dtype=torch.long, device=device)
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, envs.num_envs), device=device) for _ in range(4))
    to_device = ToDevice(device)  # [34] pinned copies

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    # ── Ctrl-C before the checkpoints' handler: one line, no traceback ──
    signal.signal(signal.SIGINT, lambda *_: sys.exit(f"\n{SCRIPT}.py: stopped; runs/{run_name} has what finished"))
    # ── end Ctrl-C ──
    next_obs = torch.as_tensor(envs.reset()[0], device=device)
    next_done = torch.zeros(envs.num_envs, device=device)
    recent_returns, recent_test_returns, start_time = deque(maxlen=100), deque(maxlen=100), time.time()
    # ── checkpoints [25]: continue exactly: weights, optimizer, games, wrapper statistics, random states, counters ──
    start_iteration = 1
    if ckpt:
        recent, tests = (recent_returns, recent_test_returns), test_envs if args.eval_interval > 0 else None
        mine = restore_run(ckpt, agent, optimizer, envs, tests, recent, device, args)
        next_obs, next_done = mine["next_obs"].to(device), mine["next_done"].to(device)
        if tests is not None and mine["test_obs"] is not None:
            test_obs = mine["test_obs"].to(device)
        global_step, start_iteration = ckpt["global_step"], ckpt["iteration"] + 1
    stop = GracefulStop()
    # ── end checkpoints ──
    # ── RND [33]: its observation statistics start from a random policy's steps (a resumed run has its own) ──
    if args.intrinsic_coef > 0 and not ckpt:
        next_obs, next_done = warm_up_rnd(agent.rnd, envs, next_obs, args)
    # ── end RND ──
    # ── torch.compile [36]: the loop's stages, compiled (or as they are) ──
    names = ("policy_step", "compute_gae", "update_minibatch")
    policy_step, compute_gae, update_minibatch = compiled_stages(names, [optimizer], device, args)
    # ── end torch.compile ──
    start_time, start_step = time.time(), global_step  # [25] the steps per second count from here, on a resume too
    # ── the status line: drawn by `progress`, on rank 0's terminal only ──
    if sys.stdout.isatty() and args.rank == 0 and not isinstance(sys.stdout, StatusLine):
        sys.stdout = StatusLine(sys.stdout)
    started = (start_time, start_step)
    # ── end status line ──

    for iteration in range(start_iteration, args.num_iterations + 1):
        iteration_start, episodes = time.time(), []
        where = f"iter {iteration}/{args.num_iterations}"  # the status line
        last_good = {"iteration": iteration - 1, "model": copy.deepcopy(agent.state_dict()),
                     "optimizer": copy.deepcopy(optimizer.state_dict())}  # fmt: skip  # [26] divergence guard
        if args.anneal_lr:  # [16] over the whole run
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            set_lr(optimizer, lrnow)  # [36] in place where it is a device tensor

        env_time = inference_time = 0.0  # [32] perf timers: where the time goes, logged as perf/*
        # ── folded and pipelined rollouts [35] ──
        eval_now = args.eval_interval > 0 and iteration % args.eval_interval == 0
        folded = eval_now and args.rollout != "plain"
        policy = RolloutPolicy(agent, policy_step, envs, *((test_envs, test_obs) if folded else (None, None)), args,
                               to_device, iteration)  # fmt: skip
        # ── end folded and pipelined rollouts ──
        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done
            # ALGO LOGIC: action logic
            tick = time.perf_counter()  # [32]
            action, logprobs[step], values[step] = policy(next_obs)  # [35] policy_step, or folded
            actions[step] = action
            action = action.cpu().numpy()
            inference_time += time.perf_counter() - tick  # [32]
            # TRY NOT TO MODIFY: execute the game and log data.
            tick = time.perf_counter()  # [32]
            next_obs, reward, terminations, truncations, infos = envs.step(action)
            policy.step_test_envs()  # [35] a folded rollout's test envs
            env_time += time.perf_counter() - tick  # [32]
            rewards[step] = to_device("reward", reward).view(-1)
            next_obs = to_device("obs", next_obs)
            next_done = to_device("done", np.logical_or(terminations, truncations), torch.float32)
            log_episodes(episodes, infos, global_step, "")
            progress(f"{where}  rollout {step + 1}/{args.num_steps}", global_step, started, args)

        # ── folded and pipelined rollouts [35] ──: the test envs' episodes, at the end, as the test loop logs them
        if folded:
            test_obs = policy.test_obs
            episodes += [(tag, global_step, r, l) for tag, _, r, l in policy.test_episodes]
        # ── end folded and pipelined rollouts ──
        eval_start = time.perf_counter()  # [32]
        if eval_now and not folded:  # [13] the same policy (or [35] folded into the rollout)
            # test actions from their own generator: training's draws stay the same
            with torch.random.fork_rng([device] if device.type == "cuda" else []):
                torch.manual_seed(env_seed + 1_000_003 + iteration)  # [30] each process's own draws
                for _ in range(args.num_steps):
                    test_action = policy_step(agent, test_obs)[0]
                    test_obs, _, _, _, test_infos = test_envs.step(test_action.cpu().numpy())
                    test_obs = to_device("test_obs", test_obs)
                    log_episodes(episodes, test_infos, global_step, "test_")

        eval_time, update_start = time.perf_counter() - eval_start, time.perf_counter()  # [32]
        # ── RND [33] ──: the intrinsic reward joins the extrinsic one before GAE (rllte adds it after GAE, where it
        # never reaches the update); in pretraining it replaces it
        if args.intrinsic_coef > 0:
            next_obs_seq = torch.cat([obs[1:], next_obs[None]])  # the observation each step led to
            intrinsic = agent.rnd.intrinsic_reward(obs, next_obs_seq, args.local_minibatch_size)
            rewards.mul_(0.0 if args.pretraining else 1.0).add_(args.intrinsic_coef * intrinsic)
        # ── end RND ──
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
            b_mean, b_std = global_mean_std(b_advantages, args.world_size)  # [30] over all processes' batches
            b_advantages = (b_advantages - b_mean) / (b_std + 1e-8)

        # Optimizing the policy and value network
        clipfracs, batch = [], (b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values)
        rho_clipped, mb_weight_means, vtrace = torch.zeros((), device=device), [], None  # [28], [29]
        beta = args.prio_beta0 + (1 - args.prio_beta0) * args.prio_alpha * (iteration - 1) / args.num_iterations  # [29]
        for epoch in range(args.update_epochs):
            # ── V-trace [28], Metta's PPO loss ──: each epoch starts from GAE (ratio 1) over the batch, from the values
            # as the minibatches before left them (and the current network's bootstrap value): its advantages rank the
            # segments [29], and with the values they are each minibatch's value targets (update_minibatch)
            if args.vtrace:
                if epoch == 0:  # the minibatches refresh a copy: the rollout's values stay, for explained variance
                    refreshed = b_values.clone()
                with torch.no_grad():
                    next_value = next_value if epoch == 0 else agent.get_value(next_obs).reshape(1, -1)
                    advantages = compute_gae(rewards, refreshed.view(args.num_steps, -1), dones, next_value, next_done,
                                             args.gamma, args.gae_lambda)[0]  # fmt: skip
                batch = (b_obs, b_actions, b_logprobs, advantages.reshape(-1), b_returns, refreshed)
                vtrace = (rewards.reshape(-1), dones.reshape(-1), next_value[0], next_done, refreshed)
            # ── end V-trace ──
            for mb_inds, mb_weights in minibatches(advantages, args, beta):  # [29]
                mb_vtrace = vtrace and vtrace_part(vtrace, mb_inds, rho_clipped)  # [28] None without V-trace
                mb = [*(take(x, mb_inds) for x in batch), mb_weights, mb_vtrace]  # [8]
                stats = update_minibatch(agent, optimizer, mb, args)
                clipfracs.append(stats["clipfrac"])
                if mb_weights is not None:  # [29]
                    mb_weight_means.append(mb_weights.mean())
                progress(f"{where}  update, epoch {epoch + 1}", global_step, started, args)

            # [18] Early stop once the policy moved too far
            if (
                args.target_kl is not None
                and rank_reduce([stats["approx_kl"].item()], args.world_size)[0] > args.target_kl
            ):
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        update_time = time.perf_counter() - update_start  # [32]
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        stats["clipfrac"] = torch.stack(clipfracs).mean()  # the rest: the last minibatch's
        # ── the features' statistics [28], [29], [33] ──
        if args.vtrace:  # [28] the share of importance ratios above the clip, over the minibatches
            stats["vtrace_rho_clipfrac"] = rho_clipped / len(clipfracs)
        if args.prio_alpha > 0:  # [29] the mean importance weight of the sampled segments
            stats["prio_mean_weight"] = torch.stack(mb_weight_means).mean()
        if args.intrinsic_coef > 0:  # [33] the mean normalised intrinsic reward (the predictor's loss: `rnd_loss`)
            stats["intrinsic_reward"] = intrinsic.mean()
        # ── end the features' statistics ──
        read = torch.stack(list(stats.values())).tolist()  # one read from the device
        logged = {f"losses/{name}": value for name, value in zip(stats, read, strict=True)}
        logged["losses/explained_variance"] = explained_var
        logged["charts/learning_rate"] = optimizer.param_groups[0]["lr"]
        # ── the features' statistics [29], [33] ──
        if args.intrinsic_coef > 0:
            logged["charts/intrinsic_reward"] = logged.pop("losses/intrinsic_reward")
        if args.prio_alpha > 0:
            writer.add_scalar("charts/prio_beta", beta, global_step)
        # ── end the features' statistics ──
        for tag, value in zip(logged, rank_reduce(list(logged.values()), args.world_size), strict=True):  # [30]
            writer.add_scalar(tag, value, global_step)
        parts = {"env": env_time, "inference": inference_time, "eval": eval_time, "update": update_time}  # [32]
        for part, seconds in {**parts, "iteration": time.time() - iteration_start}.items():
            writer.add_scalar(f"perf/{part}_seconds", seconds, global_step)  # rank 0's
        episodes = [e for rank_episodes in gather_objects(episodes, args.world_size) for e in rank_episodes]  # [30]
        for tag, step, r, l in episodes:
            write_episode(writer, tag, step, r, l)  # [11] the two scalars, in one event
            (recent_test_returns if tag else recent_returns).append(r)
        sps = (global_step - start_step) / (time.time() - start_time)
        writer.add_scalar("charts/SPS", int(sps), global_step)
        writer.flush()  # on disk before the console line
        report(iteration, global_step, sps, time.time() - iteration_start, (recent_returns, recent_test_returns), args)

        # ── divergence guard [26]: a non-finite loss or parameter stops the run before it reaches a checkpoint ──
        losses = {f"losses/{name}": stats[name] for name in ("policy_loss", "value_loss", "entropy")}
        if diverged(agent, losses, last_good, run_name, iteration, given, args):
            writer.close()
            raise SystemExit(3)
        # ── end divergence guard ──

        # ── checkpoints [25]: at the interval, and when a signal asked to stop ──
        signum = int(rank_reduce([stop.signum or 0], args.world_size, mean=False)[0])  # any process's signal stops all
        if (args.checkpoint_interval and iteration % args.checkpoint_interval == 0) or signum:
            mine = {
                "rng": rng_state(device), "envs": env_state(envs),
                "next_obs": next_obs.cpu(), "next_done": next_done.cpu(),
                "intrinsic_return": agent.rnd.intrinsic_return.cpu() if args.intrinsic_coef > 0 else None,  # [33]
                "test_envs": env_state(test_envs) if args.eval_interval > 0 else None,
                "test_obs": test_obs.cpu() if args.eval_interval > 0 else None,
            }  # fmt: skip
            recent = (recent_returns, recent_test_returns)
            ckpt_path = write_checkpoint(
                run_name, iteration, global_step, agent, [optimizer], mine, given, recent, args
            )
        if signum:
            writer.close()
            raise SystemExit(stopped_by_signal(signum, f"iteration {iteration}", ckpt_path, args))
        # ── end checkpoints ──

    # ── torchrun [30]: a last check that every process ended with the same weights ──
    leave_processes(agent, writer, global_step, args)
    # ── end torchrun ──

    envs.close()
    if args.eval_interval > 0:
        test_envs.close()
    writer.close()
    # ── Ctrl-C: Python's own handler again ──
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # ── end Ctrl-C ──
    if args.save_model and args.rank == 0:
        save_model(agent, f"runs/{run_name}/{args.exp_name}.cleanrl_model")
    # ── what the run was asked to keep [25]: its last checkpoint and its model file, or exit status 4 ──
    exit_unless_kept(f"runs/{run_name}")
    # ── end what the run was asked to keep ──
    return run_name


def tune_allocator():
    """[12] One glibc heap, never trimmed: big buffers reused, not mapped anew (2x on a CPU)"""
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        for option, value in ((-4, 0), (-1, 2**31 - 1), (-8, 1)):  # M_MMAP_MAX, M_TRIM_THRESHOLD, M_ARENA_MAX
            ctypes.CDLL("libc.so.6").mallopt(option, value)


# ── the algorithm's rules (PPO): its flags' rules and warnings, its checks across flags, its memory ──
ALGORITHM_RULES = {
    ("total_timesteps",): ("must hold one batch: --num-envs x --num-steps", lambda v, a: v >= a.num_envs * a.num_steps),
    ("update_epochs",): ("must be positive", lambda v, a: v > 0),
}
ALGORITHM_WARNINGS = {
    ("total_timesteps",): ("over 1% of it is not run", lambda v, a: v % (a.num_envs * a.num_steps) > v / 100),
}


def check_algorithm(args: Args):
    """PPO has no checks across its own flags beyond the shared ones."""


def memory_needed(args: Args, minibatch_size):
    """This process's bytes, and the flags that size them: the rollout (a uint8 frame, 6 numbers a step), the
    activations (1.5 MiB a sample), games (0.3 MiB each)."""
    need = args.local_batch_size * 12312 + 1.5 * 2**20 * args.local_minibatch_size  # [30] this process's share
    need += 0.3 * 2**20 * (args.num_envs + args.num_eval_envs) / args.world_size
    sizes = (f"num-envs {args.num_envs} x --num-steps {args.num_steps} / --num-minibatches {args.num_minibatches}, "
             f"--num-eval-envs {args.num_eval_envs}")  # fmt: skip
    return need, sizes


# ── end the algorithm's rules (PPO) ──


# ── the full files' plumbing ──: the console line, a model write that fails in one line, every flag's rule and the
# memory a run needs (checked before anything is built or written), the output directories
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
        return model_not_written(model_path, exc)  # [25] the run goes on to its end, then exits with status 4
    console(f"model saved to {model_path}")


RULES = {  # the rule of every flag: flags -> (rule, is `v` allowed given all flags `a`); a bool or Literal: its type
    ("exp_name", "wandb_project_name", "wandb_entity"): ("must not contain /", lambda v, a: "/" not in (v or "")),
    ("seed",): (
        "must be in [0, 2^30]: procgen's seeds are 31-bit, and the test envs' add 1,000,003 (--eval-only's 2,000,003)",
        lambda v, a: 0 <= v <= 2**30,
    ),
    ("device",): ("must be auto, cpu, cuda or cuda:N (not mps)", lambda v, a: re.fullmatch(r"auto|cpu|cuda(:\d+)?", v)),
    ("env_id",): (f"must be a Procgen game: {', '.join(PROCGEN_GAMES)}", lambda v, a: v in PROCGEN_GAMES),
    ("distribution_mode",): ("is not made for this game", lambda v, a: a.env_id in MODE_GAMES.get(v, a.env_id).split()),
    ("num_levels", "start_level", "eval_interval"): ("must be in [0, 2^31)", lambda v, a: 0 <= v < 2**31),
    ("num_envs", "num_eval_envs", "num_steps", "feature_dim"): ("must be in [1, 65536]", lambda v, a: 1 <= v <= 2**16),
    # the rules of the features' flags
    ("env_threads",): ("must be in [0, 256]", lambda v, a: 0 <= v <= 256),
    ("minibatch_size",): (
        "must divide --num-envs x --num-steps, or None",
        lambda v, a: v is None or 0 < v and a.num_envs * a.num_steps % v == 0,
    ),
    ("hidden_dim",): ("must be in [0, 65536]", lambda v, a: 0 <= v <= 2**16),
    ("cnn_channels",): (
        "must be 1 to 6 numbers in [1, 4096]",
        lambda v, a: 1 <= len(v) <= 6 and all(1 <= c <= 4096 for c in v),
    ),
    ("checkpoint_interval",): ("must be >= 0 (0: only on a signal)", lambda v, a: v >= 0),
    ("keep_checkpoints", "eval_episodes", "vtrace_rho_clip", "vtrace_c_clip"): ("must be positive", lambda v, a: v > 0),
    ("resume", "eval_only", "init_model"): ("must be a path, or None", lambda v, a: v is None or v.strip() != ""),
    ("prio_alpha", "intrinsic_coef"): ("must be >= 0", lambda v, a: v >= 0),
    ("prio_beta0",): ("must be in [0, 1]", lambda v, a: 0 <= v <= 1),
    ("norm_reward_gamma",): ("must be in (0, 1], or None: --gamma", lambda v, a: v is None or 0 < v <= 1),
    ("rnd_update_proportion",): ("must be in (0, 1]", lambda v, a: 0 < v <= 1),
    ("intrinsic_gamma",): ("must be in [0, 1]", lambda v, a: 0 <= v <= 1),
    ("rnd_obs_norm_steps",): ("must be in [0, 2^31)", lambda v, a: 0 <= v < 2**31),
    ("pretraining",): ("needs an intrinsic reward: --intrinsic-coef > 0", lambda v, a: not v or a.intrinsic_coef > 0),
    ("backend",): ("must be gloo, nccl or None", lambda v, a: v in (None, "gloo", "nccl")),
    **ALGORITHM_RULES,
    ("learning_rate",): ("must be in (0, 1)", lambda v, a: 0 < v < 1),
    ("adam_eps",): ("must be in (0, 1)", lambda v, a: 0 < v < 1),
    ("gamma", "gae_lambda"): ("must be in [0, 1]", lambda v, a: 0 <= v <= 1),
    ("num_minibatches",): ("must divide the batch", lambda v, a: v > 0 and a.num_envs * a.num_steps % v == 0),
    ("clip_coef", "max_grad_norm", "clip_reward"): ("must be positive", lambda v, a: v > 0),
    ("ent_coef", "vf_coef"): ("must be >= 0", lambda v, a: v >= 0),
    ("clip_range_vf", "target_kl"): ("must be positive, or None: off", lambda v, a: v is None or v > 0),
    ("track",): ("needs wandb: pip install wandb", lambda v, a: not v or importlib.util.find_spec("wandb")),
    ("capture_video",): ("records the test env: needs --eval-interval > 0", lambda v, a: not v or a.eval_interval > 0),
}
WARNINGS = {  # legal, but almost always a mistake: one line says why, and the run goes on
    **ALGORITHM_WARNINGS,
    ("eval_interval",): ("is more than the iterations", lambda v, a: v * a.num_envs * a.num_steps > a.total_timesteps),
    ("learning_rate",): ("is far above the 1e-4 to 1e-3 that Adam is used with", lambda v, a: v > 0.01),
    # the warnings of the features' flags
    ("checkpoint_interval",): (
        "is more than the iterations: only a signal writes a checkpoint",
        lambda v, a: v * a.num_envs * a.num_steps > a.total_timesteps,
    ),
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
    ("norm_reward_gamma",): ("has no effect without --norm-reward", lambda v, a: v is not None and not a.norm_reward),
    ("eval_episodes",): ("has no effect without --eval-only", lambda v, a: v != Args.eval_episodes and not a.eval_only),
    ("eval_train_levels",): ("has no effect without --eval-only", lambda v, a: v and not a.eval_only),
}


def arg_error(flag: str, rule: str, value=None):
    """One line naming the flag, its rule and its value, exit status 2: no traceback for a user's mistake."""
    value = "" if value is None else f" {value}"
    print(f"{SCRIPT}.py: error: --{flag.replace('_', '-')}{value}: {rule}", file=sys.stderr)
    sys.exit(2)


def check_every_flag(args: Args) -> None:
    """Stop at the first flag that breaks its rule, or at sizes that do not fit in memory; then warn of odd flags."""
    if args.minibatch_size:  # rllte's way to size minibatches: it sets num_minibatches
        args.num_minibatches = max(args.num_envs * args.num_steps // args.minibatch_size, 1)
    for flags, (rule, ok) in RULES.items():
        for flag in flags:
            value = getattr(args, flag)
            finite = not isinstance(value, float) or np.isfinite(value)
            if not (finite and ok(value, args)):
                arg_error(flag, rule if finite else "must be a finite number", value)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = auto if args.device == "auto" else args.device
    # torchrun [30]: a process's `cuda` is its local rank's GPU, set before anything touches a GPU
    local_rank = int(os.environ.get("LOCAL_RANK", "-1"))
    if local_rank >= 0 and device.startswith("cuda") and torch.cuda.is_available():
        if device != "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # every process on one GPU
            arg_error("device", "under torchrun each process takes its local rank's GPU: --device cuda", args.device)
        if device == "cuda" and local_rank >= torch.cuda.device_count():
            arg_error("device", f"LOCAL_RANK {local_rank} has no GPU: {torch.cuda.device_count()} visible; run at most "
                      "that many processes per node, or --device cpu", args.device)  # fmt: skip
        if device == "cuda":  # one process given `cuda:N` keeps it
            torch.cuda.set_device(local_rank)
            device = f"cuda:{local_rank}"
    try:  # the device must work on this machine and in this torch build
        args.device = str(torch.zeros(0, device=device).device)
    except (RuntimeError, AssertionError, NotImplementedError) as exc:  # a bad name, no such GPU, no CUDA build
        arg_error("device", f"not usable here: {str(exc).strip().splitlines()[0][:120]}", args.device)
    if args.backend == "nccl" and not args.device.startswith("cuda"):  # [30] NCCL reduces GPU tensors only
        arg_error("backend", f"reduces GPU tensors: needs a CUDA --device, not {args.device} (gloo on CPU)", "nccl")
    batch_size = args.num_envs * args.num_steps  # as train() works it out: the checks run first
    minibatch_size = batch_size // args.num_minibatches
    # feature rules that span flags
    if args.init_model is not None and args.resume is not None:
        arg_error("init-model", "cannot be combined with --resume", args.init_model)
    if args.resume is not None and args.eval_only is not None:
        arg_error("eval-only", "cannot be combined with --resume", args.eval_only)
    # torchrun [30]: every process owns num_envs / world_size envs and its share of each minibatch
    args.world_size, args.rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    for flag, value in (
        ("num_envs", args.num_envs),
        ("num_eval_envs", args.num_eval_envs),
        ("minibatch_size", minibatch_size),
    ):
        if value % args.world_size:
            arg_error(flag, f"must divide among the {args.world_size} processes of torchrun", value)
    args.local_num_envs = args.num_envs // args.world_size
    args.local_batch_size = args.local_num_envs * args.num_steps
    args.local_minibatch_size = minibatch_size // args.world_size
    check_algorithm(args)
    if args.rollout == "pipelined" and args.local_num_envs % 2:  # [35] two halves
        arg_error("rollout", "steps the envs in two halves: each process's --num-envs must be even", "pipelined")
    if args.prio_alpha > 0 and args.local_num_envs % args.num_minibatches:
        arg_error("prio-alpha", "samples whole env segments: each process's envs must be a multiple of "
                  "--num-minibatches", args.prio_alpha)  # fmt: skip
    if args.compile == "reduce-overhead" and args.world_size > 1:  # [36] until two GPUs have run it
        arg_error("compile", "would trace the gradients' all-reduce into CUDA graphs: under torchrun use --compile "
                  "default", "reduce-overhead")  # fmt: skip
    if args.vtrace and args.local_num_envs % args.num_minibatches:  # [28] as Metta's, minibatches of whole segments
        arg_error("vtrace", "takes minibatches of whole env segments: each process's envs must be a multiple of "
                  "--num-minibatches", True)  # fmt: skip
    need, sizes = memory_needed(args, minibatch_size)
    need = need if args.eval_only is None else 0  # [27] an evaluation holds no rollout, phase buffer or update
    free = torch.cuda.mem_get_info(args.device)[0] if args.device.startswith("cuda") else host_memory()
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


# ── end the full files' plumbing ──


# ── parse_args: tyro's parse errors in one line ──
def parse_args(argv=None, **tyro_kwargs) -> Args:
    """The command line (or `argv`) as Args; a parse error of tyro's is one line too, with exit status 2."""
    try:
        with contextlib.redirect_stderr(io.StringIO()) as box:
            return tyro.cli(Args, args=argv, **tyro_kwargs)
    except SystemExit as exc:
        if exc.code:  # 0 is --help; else keep the box's first paragraph below its title: "Error parsing --seed: ..."
            paragraph = (re.split("[─-]{3,}", box.getvalue()) + ["", "see --help"])[1].replace("│", " ")
            print(f"{SCRIPT}.py: error:", *paragraph.strip("╮").split(), file=sys.stderr)
            exc.code = 2
        raise


# ── end parse_args: tyro's parse errors in one line ──


def check_args(args: Args):
    """The common mistakes, each in one line (tyro rejects a wrong type)."""
    # ── every flag's rule ──
    check_every_flag(args)
    # ── end every flag's rule ──
    batch, sizes = args.num_envs * args.num_steps, ("num_envs", "num_steps", "num_eval_envs")
    games = MODE_GAMES.get(args.distribution_mode, args.env_id).split()
    divides = args.num_minibatches >= 1 and batch % args.num_minibatches == 0
    for flag, ok, rule in [
        ("env_id", args.env_id in PROCGEN_GAMES, f"must be one of {', '.join(PROCGEN_GAMES)}"),
        ("distribution_mode", args.env_id in games, "is not made for this game"),
        *((flag, getattr(args, flag) >= 1, "must be at least 1") for flag in sizes),
        ("total_timesteps", args.total_timesteps >= batch, "must hold a batch: --num-envs x --num-steps"),
        ("num_minibatches", divides, "must divide --num-envs x --num-steps"),
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
    try:
        train(parse_args(default=cli_defaults(sys.argv[1:])))  # [25] a checkpoint's flags as the defaults
    except BrokenPipeError:  # nothing reads the output any more: exit quietly, as command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
