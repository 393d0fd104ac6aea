"""The full files' plumbing, written once: checkpoints and exact resume, torchrun, the flags' rules and one-line errors,
the console, signals and process settings, evaluating a saved agent, the folded rollout and the compiled stages. Nothing
here changes what is learned: the algorithm and its options (V-trace, prioritised sampling, RND, PPG's phases) are in
each full file, which calls these by name. The lean files import nothing from here."""

import ast
import contextlib
import copy
import errno
import fcntl
import functools
import glob
import importlib.util
import inspect
import io
import itertools
import os
import pickle
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import typing
from collections import deque
from pathlib import Path

# The script's name in every message: the one run as `python SCRIPT` (`serve` sets it where a process imports another)
SCRIPT = os.path.basename(getattr(sys.modules["__main__"], "__file__", None) or sys.argv[0])[: -len(".py")]
# One-line errors, before the imports below would fail: an unsupported Python, a missing package
if not (3, 10) <= sys.version_info[:2] <= (3, 13):  # no procgen package is built for another Python (requirements.txt)
    sys.exit(f"{SCRIPT}.py: error: Python {sys.version.split()[0]} has no procgen package: use Python 3.10 to 3.13")


def installed(name):
    with contextlib.suppress(ImportError, ValueError):  # ValueError: blocked in sys.modules
        return importlib.util.find_spec(name) is not None


for names in ("gymnasium", "numpy", "torch", "tyro", "tensorboard", "procgen procgen_gym"):  # procgen_gym: 3.13's
    if not any(installed(name) for name in names.split()):
        sys.exit(f"{SCRIPT}.py: error: {names.split()[0]} is not installed for Python {sys.version.split()[0]}: "
                 "pip install -r requirements.txt")  # fmt: skip

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import tyro
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter


def serve(path):
    """The full file that this module serves, named in every message and checkpoint."""
    global SCRIPT
    SCRIPT = os.path.basename(path)[: -len(".py")]


# Checkpoints: the flags a checkpoint must share with a run that loads it (the network, and the rollout)
NETWORK_FLAGS = ("feature_dim", "hidden_dim", "cnn_channels")  # as Agent's arguments are named
ROLLOUT_FLAGS = ("env_id", "distribution_mode", "num_levels", "start_level", "num_envs", "num_steps", "num_eval_envs")


# rllte's aliases: rllte's names for CleanRL's flags, `--lr 1e-3` for `--learning-rate 1e-3`
RLLTE_ALIASES = {"exp_name": "--tag", "init_model": "--init-model-path", "learning_rate": "--lr", "adam_eps": "--eps",
                 "gamma": "--discount", "minibatch_size": "--batch-size", "clip_coef": "--clip-range"}  # fmt: skip


def add_aliases(Args, aliases):
    """Give each field of `Args` named in `aliases` its other flag, as tyro reads it, and each its docstring as one
    paragraph: tyro keeps a docstring's line breaks, which `--help` would show as lines cut short."""
    fields, docs = [], {}
    with contextlib.suppress(OSError, TypeError):  # no source to read (a script piped into python): tyro's help
        fields = ast.parse(textwrap.dedent(inspect.getsource(Args))).body[0].body
    for field, doc in zip(fields[:-1], fields[1:], strict=True):
        if isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
            docs[field.target.id] = " ".join(doc.value.value.split())
    for name, field in Args.__dataclass_fields__.items():
        conf = tyro.conf.arg(aliases=(aliases[name],) if name in aliases else None, help=docs.get(name))
        field.type = Args.__annotations__[name] = typing.Annotated[Args.__annotations__[name], conf]


# The folded rollout [35]: the games step while the policy computes
class AheadSteps:
    """procgen's gym3 games, whose next step may start (`act_ahead`) before the adapter's `step` waits for it."""

    def __init__(self, games):
        self.games, self.started = games, False

    def act_ahead(self, actions):
        self.games.act(actions)
        self.started = True

    def act(self, actions):
        """The adapter's step: unless the policy step started it already."""
        if not self.started:
            self.games.act(actions)
        self.started = False

    def __getattr__(self, name):  # observe, get_state, set_state: the games' own (gym3 copies what it returns)
        return getattr(self.games, name)


class RolloutPolicy:
    """[35] The rollout's policy step: the lean loop's (`--rollout plain`); folded, the training envs' games step during
    the test envs' forward pass, which then starts their step (`step_test_envs` waits). The noise is drawn ahead a
    step's draw at a time, as the plain loop draws it (one tensor of all steps gives other numbers on a GPU)."""

    def __init__(self, agent, policy_step, envs, test_envs, test_obs, args, to_device, iteration, log_episodes):
        self.eval_now = args.eval_interval > 0 and iteration % args.eval_interval == 0  # the test envs step now
        self.folded = self.eval_now and args.rollout == "folded"  # and inside the rollout
        self.agent, self.policy_step, self.envs = agent, policy_step, envs  # [36] the stage, compiled or not
        self.test_envs, self.test_obs = test_envs, test_obs  # stepped here when folded
        self.to_device, self.log_episodes, self.t, self.test_episodes, self.noise = to_device, log_episodes, 0, [], None
        device, actions = next(agent.parameters()).device, envs.single_action_space.n

        def drawn(num_envs):  # the rollout's noise, a step's draw at a time, as `policy_step` draws it
            steps = [torch.empty((num_envs, actions), device=device).exponential_() for _ in range(args.num_steps)]
            return torch.stack(steps)

        if args.rollout == "folded":
            self.noise = drawn(envs.num_envs)
        if self.folded:  # the test envs' noise, from the plain test loop's own generator
            with torch.random.fork_rng([device] if device.type == "cuda" else []):
                torch.manual_seed(args.seed + 7919 * args.rank + 1_000_003 + iteration)  # [30] each process's own
                self.test_noise = drawn(test_envs.num_envs)

    def __call__(self, next_obs):
        if self.noise is None:
            return self.policy_step(self.agent, next_obs)
        out = self.policy_step(self.agent, next_obs, self.noise[self.t])
        if self.folded:  # the training envs' games step while the test envs' forward pass runs, then theirs start
            self.action = out[0].cpu().numpy()
            self.envs.unwrapped.act_ahead(self.action)
            self.test_action = self.policy_step(self.agent, self.test_obs, self.test_noise[self.t])[0].cpu().numpy()
            self.test_envs.unwrapped.act_ahead(self.test_action)
        self.t += 1
        return out

    def on_host(self, action):
        """The step's actions as the games take them; folded, the copy the policy step made (the GPU waited once)."""
        return self.action if self.folded else action.cpu().numpy()

    def test_results(self, test_obs, episodes, global_step):
        """Folded, at the rollout's end: the test envs' episodes join `episodes` as the test loop logs them, and their
        observations are the next rollout's; else `test_obs` as it was."""
        if not self.folded:
            return test_obs
        episodes += [(tag, global_step, r, l) for tag, _, r, l in self.test_episodes]
        return self.test_obs

    def step_test_envs(self):
        """Wait for the test envs' step that the policy step started (folded), and keep the episodes that ended."""
        if self.folded:
            test_obs, _, _, _, test_infos = self.test_envs.step(self.test_action)
            self.test_obs = self.to_device("test_obs", test_obs)
            self.log_episodes(self.test_episodes, test_infos, 0, "test_")


class Timer:
    """[32] `lap(part)` adds the seconds since the last lap to `part` (none: to nothing): perf/{part}_seconds."""

    def __init__(self):
        self.seconds, self.last = {}, time.perf_counter()

    def lap(self, part=None):
        now = time.perf_counter()
        if part is not None:
            self.seconds[part] = self.seconds.get(part, 0.0) + now - self.last
        self.last = now


# The status line: on a terminal, one line rewritten in place with the progress, the SPS and the time left
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
        if time.time() - self.drawn > 0.25:  # at most 4 times a second: the rollout does not wait on it
            with contextlib.suppress(OSError):  # a failing terminal: console() below says nothing more either
                self.stream.write(f"\r\033[K{text}")
                self.stream.flush()
            self.shown, self.drawn = True, time.time()

    def restore(self):  # the terminal's own stream, to put back as sys.stdout
        if self.shown:
            with contextlib.suppress(OSError):
                self.stream.write("\r\033[K")
        return self.stream

    def __getattr__(self, name):  # flush, isatty, fileno, ...: the terminal's
        return getattr(self.stream, name)


# bf16 autocast [31], and the agent's options
def autocast_bf16(module):
    """Run `module` under bf16 autocast; its output goes back to fp32, so every loss and ratio stays in fp32."""
    forward = module.forward

    def forward_bf16(x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return forward(x).float()

    module.forward = forward_bf16
    return module


def agent_options(agent, envs, test_envs, args):
    """`--init-model`'s weights; bf16 autocast [31] of the encoders alone (bf16 heads would round logits and values
    before the ratio); [35] the folded rollout's envs; [30] rank 0's weights everywhere, each process's own actions."""
    if args.init_model is not None:  # e.g. fine-tuning a pretrained agent: its weights, a fresh optimizer
        load_weights(agent, args.init_model, "init-model")
    for name, module in agent.named_children():
        if name in ("network", "value_network") and args.autocast == "bf16":
            autocast_bf16(module)
    if args.rollout == "folded":
        envs.unwrapped.start_ahead()
        if test_envs is not None:
            test_envs.unwrapped.start_ahead()
    if args.world_size > 1:
        for p in agent.parameters():
            dist.broadcast(p.data, src=0)
        torch.manual_seed(args.seed + args.rank)


# torch.compile [36]: the loop's stages, compiled
def compiled_stages(stages, optimizers, device, args):
    """The `stages`, or (`--compile`) each compiled but the advantages: the learning rate a device tensor (`set_lr`)
    and Adam's steps on a GPU too (capturable), read without recompiling or waiting; draws from torch's generator, as
    eager runs draw; with CUDA graphs each call's outputs copied out of the memory that the next replay reuses."""
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
        # Adam makes a state at a parameter's first gradient and the compiled step guards on their count: a head that
        # first learns later (PPG's auxiliary one) would compile it again. Every state made now as Adam makes it
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

    # the advantages stay eager: compiled, their loop unrolls (84 s of cold compile for 256 steps on a 2-core CPU)
    return [stage if stage.__name__ == "compute_gae" else compiled(stage) for stage in stages]


def set_lr(optimizer, lr):
    """Set the learning rate, in place where it is a device tensor (`--compile`): the compiled step keeps its graph"""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


# Minibatch gathers [8]: rows of bytes
def take(x, inds, dim=0):
    """x[inds] (dim 0) or x[:, inds] (dim 1) by one `index_select` of rows of bytes (2048 frames: 2.7 ms, not 17.6)"""
    rows = x.reshape(*x.shape[: dim + 1], -1).index_select(dim, inds)
    return rows.view(*x.shape[:dim], len(inds), *x.shape[dim + 1 :])


# One event per episode [11]
def write_episode(writer, tag, step, r, l):
    """An episode's `charts/{tag}episodic_return` and `..._length` in one event, not two: the writer's thread checksums
    each in Python, holding the GIL (850 episodes: 24.8 ms, not 61.4, on a 2-core EPYC, medians of 5)."""
    values = [Summary.Value(tag=f"charts/{tag}episodic_{k}", simple_value=v) for k, v in (("return", r), ("length", l))]
    writer.file_writer.add_summary(Summary(value=values), step)


# Pinned copies [34]
class ToDevice:
    """The envs' arrays on the device: on CUDA through a pinned buffer of its own, copied asynchronously (the next
    actions' `.cpu()` waits for the copy before the envs write again); elsewhere sharing the array's memory."""

    def __init__(self, device):
        self.device, self.pinned = device, {}

    def __call__(self, key, array, dtype=None):
        if self.device.type != "cuda":
            return torch.as_tensor(array, device=self.device, dtype=dtype)
        host = torch.as_tensor(array, dtype=dtype)
        if key not in self.pinned:  # an env's arrays keep their shape and dtype
            self.pinned[key] = torch.empty_like(host).pin_memory()
        return self.pinned[key].copy_(host).to(self.device, non_blocking=True)


# torchrun [30]: data parallelism, one flattened all-reduce of the gradients per step, global statistics
def all_reduce_grads(params, world_size):
    """Average the gradients over the processes, in one all-reduce of all of them flattened together."""
    if world_size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    for g, mean in zip(grads, (flat / world_size).split([g.numel() for g in grads]), strict=True):
        g.copy_(mean.view_as(g))


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


class NullWriter:
    """The TensorBoard writer of processes other than rank 0: they log nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    @property
    def file_writer(self):  # `writer.file_writer.add_summary(...)` does nothing either
        return self


def join_processes(args, device):
    """Under torchrun, join the process group (rank 0 alone prints). The run's name, agreed by all: a new run's own
    directory (`_2`, ... where taken); a named job's first attempt marks its (`torchrun_job`) for the job's restarts."""
    env = os.environ
    if args.world_size > 1:
        # torch._dynamo first (Adam imports it): imported after the group is made, it holds references to it, which
        # keep gloo's threads alive past destroy_process_group; one of them may then abort the process as Python exits
        import torch._dynamo  # noqa: F401

        backend = args.backend or ("nccl" if device.type == "cuda" else "gloo")
        if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            dist.init_process_group(backend)
        else:  # the agent's store outlives a restart, keys and all: each round has its own prefix, not the dead's
            store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False)
            store = dist.PrefixStore(f"round_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)
            dist.init_process_group(backend, store=store, rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]))
        if args.rank > 0:  # one process speaks for all
            sys.stdout = open(os.devnull, "w")
    job = env.get("TORCHELASTIC_RUN_ID", "none")  # torchrun's "none": no --rdzv-id, no --standalone
    stamp = job if job != "none" else gather_objects(int(time.time()), args.world_size)[0]  # rank 0's clock
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{stamp}"
    owner = f"{job} {socket.gethostname()} {os.getppid()}\n"  # torchrun's agent, the workers' parent, outlives restarts
    restarted, found = int(env.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0, None
    if restarted and args.resume is not None:  # from the newest checkpoint of the run that --resume continued
        ckpt = load_checkpoint(args.resume, "resume")[1]
        found = ckpt.get("run_name", run_name) if isinstance(ckpt, dict) else run_name
    elif restarted and job != "none":  # the directory that this job's first attempt made, if it got that far
        dirs = sorted(glob.glob(f"runs/{glob.escape(run_name)}*"))
        mine = [d for d in dirs if Path(d, "torchrun_job").is_file() and Path(d, "torchrun_job").read_text() == owner]
        found = gather_objects(os.path.basename(mine[0]) if mine and args.rank == 0 else None, args.world_size)[0]
    elif restarted:
        console("torchrun restarted the job, which has no name to find its run by (--rdzv-id or --standalone gives "
                "it one): it starts anew")  # fmt: skip
    if found is not None and checkpoints(f"runs/{found}"):
        args.resume = f"runs/{found}"
    if args.resume is None and found is None:  # a new run: a directory of its own
        made = make_dir(f"runs/{run_name}", "exp-name", new=True) if args.rank == 0 else None
        if made is not None and job != "none":  # the job's mark, by which its restarts find the directory
            try:
                Path(made, "torchrun_job").write_text(owner)
            except OSError as exc:  # a full disk, a file-size limit: one line, as for the directory
                arg_error("exp-name", f"{made}: cannot write its torchrun_job file: {exc.strerror or exc}")
        run_name = os.path.basename(gather_objects(made, args.world_size)[0])
    return found or run_name


# Checkpoints [25]: everything a run needs to continue exactly, procgen's games included, written atomically
def env_state(envs):
    """Procgen's game states (exact: its level generator too) and the statistics of every wrapper around it."""
    state, env, kept = [], envs, (np.ndarray, deque, gym.wrappers.utils.RunningMeanStd, int, float)
    while isinstance(env, gym.vector.VectorWrapper):
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


NOT_WRITTEN = {}  # by run directory, what the run was asked to write and could not: {"checkpoint": path, "model": path}
LOADED, SKIPPED = {}, set()  # the last checkpoint read (by path, time and size); the unreadable ones a warning named
HELD = []  # the run directories' lock files that this process holds: closed, and so released, when `train` ends


def checkpoints(folder, inside="checkpoints/"):
    """The `iter_*.pt` files in the run directory `folder` (`inside=""`: in `folder` itself), oldest first, as their
    names sort. The folder's name is a name, not a pattern: a sweep's `--exp-name 'lr[1e-3]'` is found too."""
    return sorted(glob.glob(f"{glob.escape(folder)}/{inside}iter_*.pt"))


def what_is_kept(run_dir, then=False):
    """The newest checkpoint of the run on disk (each is written whole or not at all) and its iteration, in words;
    `then`: and the command that resumes from it, or that the run cannot be resumed."""
    found = checkpoints(run_dir)
    if not found:
        return "no checkpoint of this run exists yet" + (": the run cannot be resumed" if then else "")
    resume = f": resume with: python {SCRIPT}.py --resume {shlex.quote(found[-1])}" if then else ""  # a shell's quotes
    return f"the newest checkpoint kept is {found[-1]} (iteration {int(os.path.basename(found[-1])[5:13])}){resume}"


def exit_unless_kept(run_dir):
    """A run that ends without its last checkpoint or its model file written exits with status 4, its last line
    saying what is on disk: a scheduler or a sweep that reads the status must not take it for a run to resume or use."""
    missed = NOT_WRITTEN.pop(run_dir, {})
    if "checkpoint" in missed:
        kept = what_is_kept(run_dir, then=True)
        say(f"error: the run ended without its last checkpoint, {missed['checkpoint']}; {kept}")
    if missed:
        raise SystemExit(4)


def write_whole(run_dir, path, obj):
    """torch.save `obj` to `path.tmp`, flushed, renamed to `path`: a kill leaves the old files whole. A failed write (a
    full disk) leaves nothing and returns the system's reason; a run directory that is gone is not made again."""
    if not os.path.isdir(run_dir):  # removed mid-run
        raise FileNotFoundError(errno.ENOENT, "the run directory is gone", run_dir)
    try:  # buffered, as open's files are, which write a short write's rest or raise with the system's reason (torch
        # would take a short write for a broken archive); a large tensor goes to the file, not through a copy in memory
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
    except (OSError, RuntimeError) as error:
        exc = error if isinstance(error, OSError) else error.__context__  # torch's archive error hides the system's
        if not isinstance(exc, OSError) or removed_run_dir(exc):
            raise
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")
        return exc.strerror or str(exc)


def save_checkpoint(run_dir, name, state, keep=None, kept=None):
    """Write a checkpoint whole (`write_whole`), or say in one line that it was not and return None. Then the `keep`
    newest stay: of the checkpoints named before this one, the oldest go, never `kept` (the run resumed from it)."""
    path = f"{run_dir}/checkpoints/{name}"
    why = write_whole(run_dir, path, plain(state))
    if why is not None:
        if name.startswith("iter_"):  # what the end of the run reports (exit_unless_kept)
            NOT_WRITTEN.setdefault(run_dir, {})["checkpoint"] = path
        say(f"warning: {path} not written: {why}; {what_is_kept(run_dir)}")
        return None
    if name.startswith("iter_"):
        NOT_WRITTEN.get(run_dir, {}).pop("checkpoint", None)
    older = [p for p in checkpoints(run_dir) if os.path.basename(p) < name]
    for old in older[: max(len(older) - keep + 1, 0) if keep else 0]:
        if not (kept and os.path.exists(kept) and os.path.samefile(old, kept)):
            os.remove(old)
    return path


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
        found = sorted(checkpoints(path) + checkpoints(path, inside=""))
        if not found:
            arg_error(flag, f"{path}: no checkpoint (checkpoints/iter_*.pt) in this run directory")
        for newer in found[:0:-1]:  # newest first; the oldest is read as a file named by the flag would be
            try:
                return newer, read_checkpoint(newer)
            except ValueError as why:
                if newer not in SKIPPED:  # `--resume` looks twice: one warning
                    SKIPPED.add(newer)
                    say(f"warning: --{flag}: {newer}: skipped, {why}")
        path = found[0]
    if path.endswith(".tmp"):  # a write that a second signal or a crash cut short: never a checkpoint
        arg_error(flag, f"{path}: an unfinished checkpoint write, not a checkpoint")
    if not os.path.isfile(path):
        arg_error(flag, f"{path}: no such file")
    try:
        return path, read_checkpoint(path)
    except ValueError as why:
        arg_error(flag, f"{path}: {why}")


def check_checkpoint(path, ckpt, args, flags, flag):
    """Refuse a checkpoint of the other script, or one whose network or rollout sizes differ, naming what differs."""
    if not isinstance(ckpt, dict) or "args" not in ckpt:
        arg_error(flag, f"{path}: not a checkpoint of these scripts")
    if ckpt.get("script") != SCRIPT:
        arg_error(flag, f"{path}: written by {ckpt.get('script')}.py, not {SCRIPT}.py")
    for key in flags:
        # a flag newer than the checkpoint: the default that the checkpoint's run had
        saved = ckpt["args"].get(key, type(args).__dataclass_fields__[key].default)
        if saved != getattr(args, key):
            shown = [" ".join(map(str, v)) if isinstance(v, tuple) else v for v in (saved, getattr(args, key))]
            arg_error(flag, f"{path}: made with --{key.replace('_', '-')} {shown[0]}, this run has {shown[1]}")


def resume_checkpoint(args):
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


def hold_run(run_dir, args):
    """One run at a time in a run directory: rank 0 holds an flock on `run_dir/lock` (released when its process dies),
    and a second run there (the same `--resume` twice, a job requeued while it runs) stops in one line."""
    problem = None  # the flag, and why the run cannot go on here
    if args.rank == 0:
        f = open(f"{make_dir(run_dir, 'exp-name')}/lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            HELD.append(f)
            f.truncate(0)
            os.write(f.fileno(), f"{socket.gethostname()} {os.getpid()}\n".encode())  # unbuffered: closing cannot fail
        except BlockingIOError:  # held by another process
            f.seek(0)
            holder = f.read().strip() or "unknown"
            problem = ("resume", f"in use by a run that is still going (machine and process: {holder}); stop it "
                       "first, or resume a copy of the directory")  # fmt: skip
            f.close()
        except OSError as exc:  # a full disk, a file-size limit: not another run's lock
            problem = ("exp-name", f"cannot write its lock file: {exc.strerror or exc}")
    problem = gather_objects(problem, args.world_size)[0]  # every process stops, not rank 0 alone
    if problem is not None:
        arg_error(problem[0], f"{run_dir}: {problem[1]}")


def set_aside_newer(ckpt, run_dir):
    """A `*.tmp` of a cut write goes; a resume from older than its run's newest checkpoint moves the newer ones to
    `checkpoints/abandoned/`, so that rotation, `--resume RUN_DIR` and torchrun restarts follow this line."""
    for tmp in glob.glob(f"{glob.escape(run_dir)}/checkpoints/*.tmp") + glob.glob(f"{glob.escape(run_dir)}/*.tmp"):
        os.remove(tmp)
    found = checkpoints(run_dir) if ckpt else []
    newer = [p for p in found if os.path.basename(p) > checkpoint_name(ckpt["iteration"], ckpt.get("aux_epoch", 0))]
    if newer:
        aside = make_dir(f"{run_dir}/checkpoints/abandoned", "resume", new=True)
        for path in newer:
            os.replace(path, f"{aside}/{os.path.basename(path)}")
        say(f"warning: --resume: {ckpt['path']} is older than {len(newer)} checkpoint(s) of its run, now in {aside}/; "
            f"the run goes on from iteration {ckpt['iteration']}")  # fmt: skip


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


def restore_run(ckpt, agent, optimizer, envs, test_envs, recent, device, args, aux_optimizer=None):
    """Continue exactly where `ckpt` stopped: the weights, the optimizers (a separate auxiliary one afresh where the
    checkpoint has none), this process's games, wrappers and random states, the console's averages; its part."""
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


def checkpoint_name(iteration, aux_epoch=0):
    """`iter_N.pt` after iteration N; in its auxiliary phase `iter_N.auxEEE.pt`: the names sort as a run writes them."""
    return f"iter_{iteration:08d}.aux{aux_epoch:03d}.pt" if aux_epoch else f"iter_{iteration:08d}.pt"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal or the ssh connection is gone


class GracefulStop:
    """SIGINT, SIGTERM, SIGHUP: finish the iteration, write a checkpoint and exit; a second signal exits at once."""

    def __init__(self):
        self.signum, self.until = None, "this iteration or auxiliary epoch"  # what a stop finishes first
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
            print(f"\n{name}: finishing {self.until}, then writing a checkpoint ({name} again exits at once)",
                  file=sys.stderr, flush=True)  # fmt: skip


def cli_defaults(Args, argv):
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


# The run: what `train` calls at each place in its loop
class Run:
    """A full file's run, from its directory to its last checkpoint: torchrun's processes [30], its directory (one run
    at a time), `--resume`'s checkpoint [25], the event writer, the console, the stop signals, and after each iteration
    the logs, the divergence guard [26] and the checkpoints. `complete`: nothing is left to run (nothing written)."""

    def __init__(self, args, given, device):
        self.args, self.given, self.device, self.stop, self.mine = args, given, device, None, None
        name = join_processes(args, device)
        self.ckpt = resume_checkpoint(args)
        self.name = self.ckpt["run_name"] if self.ckpt else name
        self.dir, self.start_iteration = f"runs/{self.name}", self.ckpt["iteration"] + 1 if self.ckpt else 1
        hold_run(self.dir, args)  # released when `train` ends, or the process
        inside_a_phase = bool(self.ckpt) and bool(self.ckpt.get("aux_epoch"))  # PPG's: its auxiliary phase unfinished
        self.complete = self.start_iteration > args.num_iterations and not inside_a_phase
        if self.complete:  # nothing left to do: say so, and write nothing
            console(f"{self.dir} is complete: {self.ckpt['iteration']} of {args.num_iterations} iterations, "
                    f"{self.ckpt['global_step']} steps; to extend it: python {SCRIPT}.py --resume "
                    f"{shlex.quote(self.dir)} --total-timesteps {2 * args.total_timesteps}")  # fmt: skip
            return
        if args.rank == 0:
            set_aside_newer(self.ckpt, self.dir)
        args.resume = self.ckpt["path"] if self.ckpt else None  # the checkpoint itself, which rotation keeps
        # Ctrl-C before the checkpoints' handler (`resume`): one line, no traceback
        signal.signal(signal.SIGINT, lambda *_: sys.exit(f"\n{SCRIPT}.py: stopped; {self.dir} has what finished"))

    def event_writer(self):
        """Rank 0's TensorBoard writer, dropping the events after a resume's step (all, for a torchrun restart without a
        checkpoint); a new run's writes no purge marker (read after a resume's, as `.10` sorts before `.9`, it drops
        the resume's events). Then the console line of what runs where."""
        had_events = glob.glob(f"{glob.escape(self.dir)}/events.out.tfevents.*")
        args, purge_step = self.args, self.ckpt["global_step"] + 1 if self.ckpt else (0 if had_events else None)
        writer = NullWriter()
        if args.rank == 0:
            writer = SummaryWriter(make_dir(self.dir, "exp-name"), purge_step=purge_step, max_queue=1000)
        # [36] compiled (on a GPU by default), the first iteration compiles the stages: a slow start, said
        fast = f", --compile {args.compile} --rollout {args.rollout}: compiling first" if args.compile != "off" else ""
        console(f"{SCRIPT}.py: {args.env_id}, {args.num_iterations} iterations of {args.batch_size} steps on "
                f"{self.device}{fast}; logs in {self.dir} (tensorboard --logdir runs)")  # fmt: skip
        return writer

    def video_dir(self):
        """`--capture-video`'s directory, rank 0's (made now: one that cannot be written stops the run here)."""
        if self.args.capture_video and self.args.rank == 0:
            return make_dir(f"videos/{self.name}", "capture-video")

    def resume(self, agent, optimizers, envs, test_envs, recent, writer, *state):
        """Keep what the checkpoints save; with a checkpoint, continue where it stopped (`restore_run`): `state` (the
        step, next observations and dones, test observations) as it has them, this process's part in `mine`."""
        self.agent, self.optimizers, self.envs, self.test_envs = agent, optimizers, envs, test_envs
        self.recent, self.writer, (global_step, next_obs, next_done, test_obs) = recent, writer, state
        if self.ckpt:
            self.mine = mine = restore_run(self.ckpt, agent, optimizers[0], envs, test_envs, recent, self.device,
                                           self.args, optimizers[-1])  # fmt: skip
            next_obs, next_done = mine["next_obs"].to(self.device), mine["next_done"].to(self.device)
            if test_envs is not None and mine["test_obs"] is not None:
                test_obs = mine["test_obs"].to(self.device)
            global_step = self.ckpt["global_step"]
        self.stop = GracefulStop()
        return global_step, next_obs, next_done, test_obs

    def start_clock(self, global_step):
        """The steps per second count from here, on a resume too; on rank 0's terminal, the status line."""
        if sys.stdout.isatty() and self.args.rank == 0 and not isinstance(sys.stdout, StatusLine):
            sys.stdout = StatusLine(sys.stdout)  # drawn by `progress`
        self.started, self.total = (time.time(), global_step), self.args.num_iterations * self.args.batch_size

    def speed(self, global_step):
        """The steps per second since the clock started, and the minutes left at that pace."""
        sps = (global_step - self.started[1]) / (time.time() - self.started[0])
        return sps, (self.total - global_step) / max(sps, 1e-6) / 60

    def progress(self, iteration, text, global_step):
        """On the status line (rank 0's terminal): the iteration, `text`, the step, the SPS and the time left."""
        if isinstance(sys.stdout, StatusLine):
            sps, left = self.speed(global_step)
            sys.stdout.show(
                f"iter {iteration}/{self.args.num_iterations}  {text}  step {global_step}/{self.total}  SPS {sps:.0f}  "
                f"{left:.1f} min left"
            )

    def log(self, iteration, global_step, logged, episodes, began, seconds):
        """The iteration's scalars (their mean over the processes [30]), the `seconds` of its parts and since it
        `began` (rank 0's, [32]), every process's episodes [11] (the console's averages) and the console line."""
        args, writer = self.args, self.writer
        for tag, value in zip(logged, rank_reduce(list(logged.values()), args.world_size), strict=True):
            writer.add_scalar(tag, value, global_step)
        for part, took in {**seconds, "iteration": time.time() - began}.items():
            writer.add_scalar(f"perf/{part}_seconds", took, global_step)
        for tag, step, r, l in itertools.chain(*gather_objects(episodes, args.world_size)):
            write_episode(writer, tag, step, r, l)  # the two scalars, in one event
            self.recent[1 if tag else 0].append(r)
        sps, left = self.speed(global_step)
        writer.add_scalar("charts/SPS", int(sps), global_step)
        writer.flush()  # on disk before the console line: the means of the last 100 training and test returns
        means = [np.mean(returns or [np.nan]) for returns in self.recent]
        console(f"iter {iteration}/{args.num_iterations}  step {global_step}  SPS {sps:.0f}  ({time.time() - began:.1f}"
                f"s/iter, {left:.1f} min left)  return {means[0]:.2f}  test {means[1]:.2f}")  # fmt: skip

    def last_good(self, iteration):
        """[26] What the divergence guard writes if this iteration goes bad: the weights and optimizer before it."""
        state = {"model": self.agent.state_dict(), "optimizer": self.optimizers[0].state_dict()}
        return {"iteration": iteration - 1, **copy.deepcopy(state)}

    def guard(self, stats, last_good, iteration):
        """[26] A loss or a parameter not finite on any process stops the run (status 3) before a checkpoint: rank 0
        writes the weights from before this iteration as a diagnostic checkpoint and names what went bad."""
        watched = {f"losses/{name}": stats[name] for name in ("policy_loss", "value_loss", "entropy")}
        watched |= dict(self.agent.named_parameters())
        finite = torch.stack([torch.isfinite(value).all() for value in watched.values()]).tolist()  # one wait
        bad = next((key for key, ok in zip(watched, finite, strict=True) if not ok), None)
        bad = next((b for b in gather_objects(bad, self.args.world_size) if b is not None), None)  # stop together
        if bad is not None and self.args.rank == 0:
            diagnostic = {**last_good, "script": SCRIPT, "args": self.given, "diagnostic": True}
            path = save_checkpoint(self.dir, f"diverged_iter_{iteration:08d}.pt", diagnostic)
            where = f"are in {path}" if path else "could not be written"
            say(f"diverged at iteration {iteration}: {bad} is not finite; the weights from before this iteration "
                f"{where}; earlier checkpoints are untouched")  # fmt: skip
        if bad is not None:
            self.writer.close()
            raise SystemExit(3)

    def my_part(self, last, **more):
        """This process's part of a checkpoint: its games, random states, `last` (the next observations and dones, the
        test envs' observations), RND's running returns [33] and `more`."""
        (next_obs, next_done, test_obs), rnd = last, getattr(self.agent, "rnd", None)
        return {
            "rng": rng_state(self.device), "envs": env_state(self.envs), "next_obs": next_obs.cpu(),
            "next_done": next_done.cpu(), "intrinsic_return": rnd.intrinsic_return.cpu() if rnd is not None else None,
            "test_envs": env_state(self.test_envs) if self.test_envs is not None else None,
            "test_obs": test_obs.cpu() if self.test_envs is not None else None, **more,
        }  # fmt: skip

    def signalled(self):
        """The stop signal any process received (all stop together), or 0."""
        return int(rank_reduce([self.stop.signum or 0], self.args.world_size, mean=False)[0])

    def write(self, iteration, global_step, mine, aux_epoch=0):
        """Rank 0 writes the state after `iteration` (and `aux_epoch`) with every process's part (`mine`): its path, or
        None (not written, or another rank)."""
        args, optimizers = self.args, self.optimizers
        ranks = gather_objects(mine, args.world_size, everywhere=False)
        if args.rank > 0:
            return None
        state = {
            "script": SCRIPT, "args": self.given, "run_name": self.name, "iteration": iteration,
            "global_step": global_step, "model": self.agent.state_dict(), "optimizer": optimizers[0].state_dict(),
            "aux_optimizer": optimizers[-1].state_dict() if optimizers[-1] is not optimizers[0] else None,
            "ranks": ranks, "recent_returns": list(self.recent[0]), "recent_test_returns": list(self.recent[1]),
            "aux_epoch": aux_epoch,
        }  # fmt: skip
        path = save_checkpoint(self.dir, checkpoint_name(iteration, aux_epoch), state, args.keep_checkpoints,
                               args.resume)  # fmt: skip
        if path is not None:
            console(f"checkpoint: {path}")
        return path

    def exit_if(self, signum, where, path):
        """After a stop signal: close the log, say where the run stopped and how to resume, exit with 128 + signal."""
        if signum:
            self.writer.close()
            name = signal.Signals(signum).name
            if self.args.rank == 0 and path is None:
                console(f"stopped by {name} after {where}; no checkpoint was written")
            elif self.args.rank == 0:
                console(f"stopped by {name} after {where}, checkpoint {path}\n"
                        f"resume with: python {SCRIPT}.py --resume {shlex.quote(path)}")  # fmt: skip
            raise SystemExit(128 + signum)

    def after(self, iteration, global_step, last):
        """A checkpoint at the interval, and when a signal asked to stop (then exit)."""
        signum, path, interval = self.signalled(), None, self.args.checkpoint_interval
        if (interval and iteration % interval == 0) or signum:
            path = self.write(iteration, global_step, self.my_part(last))
        self.exit_if(signum, f"iteration {iteration}", path)

    def close(self, global_step):
        """[30] Under torchrun, log the largest difference of any process's weights from rank 0's (0 when all is well)
        and leave the process group; Ctrl-C: Python's own handler again."""
        if self.args.world_size > 1:
            flat = torch.cat([p.detach().reshape(-1) for p in self.agent.parameters()])  # channels-last ones too
            reference = flat.clone()
            dist.broadcast(reference, src=0)
            max_diff = rank_reduce([(flat - reference).abs().max().item()], self.args.world_size, mean=False)[0]
            self.writer.add_scalar("charts/ranks_max_param_diff", max_diff, global_step)
            dist.destroy_process_group()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def end(self):
        """`--save-model`'s file; [25] exit status 4 if the last checkpoint or the model file was not written."""
        if self.args.save_model and self.args.rank == 0:
            save_model(self.agent, f"{self.dir}/{self.args.exp_name}.cleanrl_model")
        exit_unless_kept(self.dir)


# Evaluation of a saved agent [27]: the first episodes of every env, so that short episodes are not favoured
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


def evaluate_saved(args, Agent, make_envs):
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
    name = f"{args.env_id}__{args.exp_name}__eval__{args.seed}__{int(time.time())}"
    video_dir = make_dir(f"videos/{name}", "capture-video") if args.capture_video else None
    envs = make_envs(min(args.num_eval_envs, args.eval_episodes), args.seed + 2_000_003, *levels, args, video_dir)
    returns = evaluate(agent, envs, args.eval_episodes, device)
    envs.close()
    where = "training" if args.eval_train_levels else "test"
    console(f"{path}: episodic return {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} {where} "
            "episodes")  # fmt: skip
    return returns


# --capture-video's files
def ffmpeg():
    """The ffmpeg that writes the videos (IMAGEIO_FFMPEG_EXE, imageio-ffmpeg's own or the system's) and None, or None
    and why none runs here: checked before a run starts, and again at each video."""
    with contextlib.redirect_stderr(io.StringIO()):  # gym3's pinned imageio-ffmpeg warns about pkg_resources
        try:
            import imageio_ffmpeg

            exe = imageio_ffmpeg.get_ffmpeg_exe()  # it tries the ones it finds, not IMAGEIO_FFMPEG_EXE's: tried here
            subprocess.run([exe, "-version"], capture_output=True, check=True)
            return exe, None
        except (ImportError, RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            return None, (str(exc).splitlines() or [type(exc).__name__])[0]


def write_video(path, frames):
    """`frames` (RGB arrays) as an mp4 at 15 frames a second, said in a line; where ffmpeg could not finish it (a full
    disk, a file-size limit), one warning with ffmpeg's reason, no partial file, and the run goes on. ffmpeg is run
    here, not through imageio_ffmpeg's writer, which takes such a write for done: ffmpeg 4 exits 0 after a failed
    trailer, so any line it prints at `-v error` is the failure (its first says why: later ones are what followed)."""
    exe, why = ffmpeg()
    size = f"{frames[0].shape[1]}x{frames[0].shape[0]}"
    flags = f"-y -v error -f rawvideo -pix_fmt rgb24 -s {size} -r 15 -i - -an -vcodec libx264 -pix_fmt yuv420p -crf 25"
    if exe:  # restore_signals=False: SIGXFSZ stays ignored, so a file-size limit fails ffmpeg's write, not kills it
        command = [exe, *flags.split(), path]
        done = subprocess.run(command, input=np.stack(frames).tobytes(), capture_output=True, restore_signals=False)
        if done.returncode == 0 and not done.stderr:
            return console(f"video: {path}")
        why = (done.stderr.decode(errors="replace").strip().splitlines() or [f"ffmpeg's status {done.returncode}"])[0]
    say(f"warning: {path} not written: {why}")
    with contextlib.suppress(OSError):
        os.remove(path)


# Process-wide settings: put back when `train` returns or raises, so that calling it twice starts clean
def removed_run_dir(exc):
    """`runs/NAME` where an OSError's file lies in a run directory that no longer exists (removed mid-run), or None."""
    parts = os.fsdecode(exc.filename or "").split(os.sep)
    gone = len(parts) > 1 and parts[0] == "runs" and not os.path.isdir(f"runs/{parts[1]}")
    return f"runs/{parts[1]}" if gone else None


def keeps_process_settings(train):
    """`sys.stdout`, the stop signals' handlers, torch.distributions' checks, torch's threads and the threads' exception
    hook put back after `train`; a run directory removed mid-run stops it in one line (status 5). Started with standard
    output closed (`>&-`, as some schedulers do), it runs silently: /dev/null takes descriptor 1 before a file could."""

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
        threads = torch.get_num_threads()  # `--torch-threads` sets them

        def quiet(failed):  # TensorBoard's writer thread's OSError (a removed run directory): the main thread meets
            writer = type(failed.thread).__name__ == "_AsyncWriterThread"  # the same one next, and says it in a line
            if not (isinstance(failed.exc_value, OSError) and writer):
                thread_hook(failed)

        threading.excepthook = quiet
        # [26] a non-finite network output must reach the divergence guard, not raise in torch.distributions
        torch.distributions.Distribution.set_default_validate_args(False)
        try:
            return train(*args, **kwargs)
        except FileNotFoundError as exc:
            if removed_run_dir(exc) is None:
                raise
            say(f"error: {removed_run_dir(exc)} was removed while the run went on, and its logs and checkpoints with "
                "it; stopped, nothing made again")  # fmt: skip
            raise SystemExit(5) from None
        except OSError as exc:  # a full disk, a quota, a file-size limit under the logs (checkpoint writes: their own)
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or not HELD:
                raise
            run_dir = os.path.dirname(HELD[0].name)  # the run directory's lock, rank 0's
            kept = what_is_kept(run_dir, then=True)
            say(f"error: {run_dir}: its logs could not be written ({exc.strerror}); {kept}")
            raise SystemExit(4) from None
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
            torch.set_num_threads(threads)
            while HELD:  # the run directory's lock
                HELD.pop().close()

    return wrapper


# A model write that fails in one line, every flag's rule and the memory a run needs (checked before
# anything is built or written), the output directories
def save_model(agent, model_path):
    """The weights, written whole (`write_whole`); a failed write (a full disk) is one line with the system's reason,
    and [25] the end of the run exits with status 4 (exit_unless_kept)."""
    why = write_whole(os.path.dirname(model_path), model_path, agent.state_dict())
    if why is None:
        return console(f"model saved to {model_path}")
    say(f"error: {model_path} not written: {why}; the logs beside it are kept")
    NOT_WRITTEN.setdefault(os.path.dirname(model_path), {})["model"] = model_path


RULES = {  # the rule of every flag: flags -> (rule, is `v` allowed given all flags `a`); a bool or Literal: its type
    ("exp_name", "wandb_project_name", "wandb_entity"): ("must not contain /", lambda v, a: "/" not in (v or "")),
    ("seed",): (
        "must be in [0, 2^30]: procgen's seeds are 31-bit, and the test envs' add 1,000,003 (--eval-only's 2,000,003)",
        lambda v, a: 0 <= v <= 2**30,
    ),
    ("device",): ("must be auto, cpu, cuda or cuda:N (not mps)", lambda v, a: re.fullmatch(r"auto|cpu|cuda(:\d+)?", v)),
    ("num_levels", "start_level", "eval_interval"): ("must be in [0, 2^31)", lambda v, a: 0 <= v < 2**31),
    ("num_envs", "num_eval_envs", "num_steps", "feature_dim"): ("must be in [1, 65536]", lambda v, a: 1 <= v <= 2**16),
    # the rules of the features' flags
    ("env_threads", "torch_threads"): ("must be in [0, 256]", lambda v, a: 0 <= v <= 256),
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
    ("keep_checkpoints", "eval_episodes"): ("must be positive", lambda v, a: v > 0),
    ("resume", "eval_only", "init_model"): ("must be a path, or None", lambda v, a: v is None or v.strip() != ""),
    ("norm_reward_gamma",): ("must be in (0, 1], or None: --gamma", lambda v, a: v is None or 0 < v <= 1),
    ("backend",): ("must be gloo, nccl or None", lambda v, a: v in (None, "gloo", "nccl")),
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
    ("eval_interval",): ("is more than the iterations", lambda v, a: v * a.num_envs * a.num_steps > a.total_timesteps),
    ("learning_rate",): ("is far above the 1e-4 to 1e-3 that Adam is used with", lambda v, a: v > 0.01),
    # the warnings of the features' flags
    ("checkpoint_interval",): (
        "is more than the iterations: only a signal writes a checkpoint",
        lambda v, a: v * a.num_envs * a.num_steps > a.total_timesteps,
    ),
    ("norm_reward_gamma",): ("has no effect without --norm-reward", lambda v, a: v is not None and not a.norm_reward),
    ("eval_episodes",): (
        "has no effect without --eval-only",
        lambda v, a: v != type(a).eval_episodes and not a.eval_only,
    ),
    ("eval_train_levels",): ("has no effect without --eval-only", lambda v, a: v and not a.eval_only),
}


def say(text):
    """One line on standard error, after the script's name: a warning or an error. Where standard error cannot be
    written (a full disk), nothing: the run goes on, and its exit status says how it ended."""
    with contextlib.suppress(OSError):
        print(f"{SCRIPT}.py: {text}", file=sys.stderr, flush=True)


def arg_error(flag: str, rule: str, value=None):
    """One line naming the flag, its rule and its value, exit status 2: no traceback for a user's mistake."""
    say(f"error: --{flag.replace('_', '-')}{'' if value is None else f' {value}'}: {rule}")
    sys.exit(2)


def check_every_flag(args, rules, warnings, check_algorithm, memory_needed) -> None:
    """Stop at the first flag that breaks its rule (`RULES`, then the script's own `rules`), or at sizes that do not fit
    in memory (`memory_needed`); then warn of odd flags (the script's `warnings`, then `WARNINGS`)."""
    if args.minibatch_size:  # rllte's way to size minibatches: it sets num_minibatches
        args.num_minibatches = max(args.num_envs * args.num_steps // args.minibatch_size, 1)
    for flags, (rule, ok) in {**RULES, **rules}.items():
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
    why = args.capture_video and ffmpeg()[1]  # the videos' writer, checked now: not a traceback at the first video
    if why:
        arg_error("capture-video", f"writes its videos with ffmpeg, which does not run here: {why}")
    # torchrun [30]: every process owns num_envs / world_size envs and its share of each minibatch
    args.world_size, args.rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    shares = {"num_envs": args.num_envs, "num_eval_envs": args.num_eval_envs, "minibatch_size": minibatch_size}
    for flag, value in shares.items():
        if value % args.world_size:
            arg_error(flag, f"must divide among the {args.world_size} processes of torchrun", value)
    args.local_num_envs = args.num_envs // args.world_size
    args.local_batch_size = args.local_num_envs * args.num_steps
    args.local_minibatch_size = minibatch_size // args.world_size
    # [35] [36] the GPU's defaults: one process on a GPU compiles its stages with CUDA graphs and folds the test envs
    # into the rollout, the fastest settings measured, meant to log the eager plain loop's numbers up to float rounding
    # (tests/test_gpu.py checks it on a GPU); a CPU and torchrun keep the lean loop, PPG's accumulated gradients eager
    gpu = args.device.startswith("cuda") and args.world_size == 1
    if args.compile == "auto":
        args.compile = "reduce-overhead" if gpu and getattr(args, "n_aux_grad_accum", 1) == 1 else "off"
    if args.rollout == "auto":
        args.rollout = "folded" if gpu else "plain"
    # a GPU run's torch computes nothing on the host, it copies: one thread, since after each parallel copy (the
    # observations', every step) OpenMP's idle threads spin for a while on the cores that procgen's threads step on
    args.torch_threads = args.torch_threads or (1 if args.device.startswith("cuda") else 0)
    if args.torch_threads:  # put back when `train` ends (keeps_process_settings)
        torch.set_num_threads(args.torch_threads)
    check_algorithm(args)
    if args.compile == "reduce-overhead" and args.world_size > 1:  # [36] until two GPUs have run it
        arg_error("compile", "would trace the gradients' all-reduce into CUDA graphs: under torchrun use --compile "
                  "default", "reduce-overhead")  # fmt: skip
    need, sizes = memory_needed(args, minibatch_size)
    need = need if args.eval_only is None else 0  # [27] an evaluation holds no rollout, phase buffer or update
    free = torch.cuda.mem_get_info(args.device)[0] if args.device.startswith("cuda") else host_memory()
    what = f"need {need / 2**30:.1f} GiB on {args.device}, {free / 2**30:.1f} GiB free"
    if need > free:
        arg_error(sizes, what)
    if need > 0.75 * free:
        say(f"warning: --{sizes}: {what}")
    for flags, (why, odd) in {**warnings, **WARNINGS}.items():
        for flag in (flag for flag in flags if odd(getattr(args, flag), args)):
            say(f"warning: --{flag.replace('_', '-')} {getattr(args, flag)}: {why}")


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


# The command line: tyro's parse errors in one line
def main(train, Args):
    """`python SCRIPT.py ...`: `train` with the command line's flags, over the defaults of the checkpoint that
    `--resume` or `--eval-only` names."""
    try:
        train(parse_args(Args, default=cli_defaults(Args, sys.argv[1:])))
    except BrokenPipeError:  # nothing reads the output any more: exit quietly, as command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def parse_args(Args, argv=None, **tyro_kwargs):
    """The command line (or `argv`) as Args; a parse error of tyro's is one line too, with exit status 2."""
    try:
        with contextlib.redirect_stderr(io.StringIO()) as box:
            return tyro.cli(Args, args=argv, **tyro_kwargs)
    except SystemExit as exc:
        if exc.code:  # 0 is --help; else keep the box's first paragraph below its title: "Error parsing --seed: ..."
            paragraph = (re.split("[─-]{3,}", box.getvalue()) + ["", "see --help"])[1].replace("│", " ")
            say("error: " + " ".join(paragraph.strip("╮").split()))
            exc.code = 2
        raise
