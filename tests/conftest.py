"""Shared helpers: load a script as a module, run it as a command, read its TensorBoard events."""

import atexit
import contextlib
import functools
import importlib.util
import io
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import gym3.libenv
import pytest
import torch
import tyro

ROOT = Path(__file__).resolve().parent.parent
# uv, on the PATH or beside this Python (a virtual environment not activated): requirements-dev.txt installs it
UV = shutil.which("uv") or shutil.which("uv", path=os.path.dirname(sys.executable))
sys.path.insert(0, str(ROOT))  # where a full file, loaded or copied, finds plumbing.py (as `python SCRIPT` does)
sys.path.insert(0, str(ROOT / "tests" / "helpers"))  # the tests' helpers: scripted games, the fork server, ...

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n: one core's worth of threads per worker, in it and its children
    torch.set_num_threads(1)  # two workers of two threads each on two cores spin-wait for each other (OpenMP)
    os.environ["OMP_NUM_THREADS"] = "1"


def _make_close_at_start(init):
    """gym3 makes each env's C functions on their first use, under one cffi lock for them all. A test process makes
    envs by the hundred, and a `train()` that raised leaves its envs in reference cycles: the garbage collector may
    then close one (`__del__`: its first `libenv_close`) inside that lock while a new env takes it, and the worker
    waits on itself forever (seen once, in a resume test). Each env's close function is made as the env is."""

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._c_lib.libenv_close  # noqa: B018 (made now, outside any other env's use of the lock)

    return wrapper


gym3.libenv.CEnv.__init__ = _make_close_at_start(gym3.libenv.CEnv.__init__)


# Work that a selected test waits on the network for starts in the background as the session starts, not when the
# test's turn comes: a worker waiting on the network holds one of the 2 cores' workers idle. A test module with such
# work defines `start_early(folder)`; the first process of the run to claim the module's folder starts it there, and
# the test, in whichever worker runs it, reads what it left (`early_work`).
RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex  # this run's name, the same in all its workers


def early_work(module):
    """The folder of `module`'s early work in this run, shared by its xdist workers: claimed and the work started there
    now, unless another process of the run did that."""
    folder = Path(tempfile.gettempdir(), f"tests-early-{RUN}-{module.__name__}")
    with contextlib.suppress(FileExistsError):
        folder.mkdir()
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the run is over when its starter exits
        module.start_early(folder)
    return folder


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what does not run
def pytest_collection_modifyitems(items):
    for module in {item.module for item in items if hasattr(getattr(item, "module", None), "start_early")}:
        early_work(module)


# A failure said as it happens, in the file that TESTS_FAILURES_FILE names (the GPU kit's): pytest writes its failures'
# reasons at the session's end, which a run stopped at its time limit never reaches. Under xdist the controller
# writes, as each worker's report arrives.
FAILURES_FILE = os.environ.get("TESTS_FAILURES_FILE")
WRITES_FAILURES = False  # set where the file is named, in the process that writes it: not an xdist worker


def pytest_configure(config):
    global WRITES_FAILURES
    WRITES_FAILURES = bool(FAILURES_FILE) and not hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    if report.failed and WRITES_FAILURES:
        lines = report.longreprtext.strip().splitlines()
        # where in the scripts it went through (a compiler's failure ends deep in torch), and how it ended
        frames = [line for line in lines[:-30] if re.search(r"(procgen\w*|plumbing)\.py:\d+: in ", line)]
        reason = frames + lines[-30:]
        with open(FAILURES_FILE, "a") as f:
            f.write(f"## {report.nodeid} ({report.when})\n" + "\n".join(reason) + "\n\n")


# Small enough for a few seconds on 2 CPU cores: 2 iterations of 4 envs x 32 steps, 2 minibatches.
SMOKE_ARGS = ["--num-envs", "4", "--num-steps", "32", "--total-timesteps", "256", "--num-minibatches", "2",
              "--num-eval-envs", "2"]  # fmt: skip
# what a script needs on top of SMOKE_ARGS for a smoke-sized run: PPG closes a phase every 2 iterations
SCRIPT_ARGS = {
    "ppo_procgen": [],
    "ppg_procgen": ["--n-iteration", "2", "--num-aux-rollouts", "2", "--e-auxiliary", "1"],
}
AUX_TAGS = ["losses/aux/kl_loss", "losses/aux/aux_value_loss", "losses/aux/real_value_loss"]
LOSS_TAGS = ["losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/old_approx_kl",
             "losses/approx_kl", "losses/clipfrac"]  # fmt: skip


class MonkeyPatch:
    """pytest's `monkeypatch`, each change undone on its own: an undo that fails still lets every other change be
    undone, then the test errors. pytest's own undo stops at the first failure and leaves the earlier patches in
    place for the rest of the session (pytest 9.2 deletes, and cannot, an attribute that a module serves through
    `__getattr__`, such as torch.backends.cuda.matmul.allow_tf32); later tests would then run on those patches."""

    def __init__(self):
        self.changes = []

    def __getattr__(self, name):  # setattr, delattr, setitem, delitem, setenv, delenv, syspath_prepend, chdir
        def change(*args, **kwargs):
            self.changes.append(pytest.MonkeyPatch())
            return getattr(self.changes[-1], name)(*args, **kwargs)

        return change

    def undo(self):
        failures = []
        while self.changes:  # the newest first, as pytest does
            try:
                self.changes.pop().undo()
            except Exception as exc:  # every change is undone before the first failure is raised
                failures.append(exc)
        if failures:
            raise failures[0]


@pytest.fixture
def monkeypatch():
    patches = MonkeyPatch()
    yield patches
    patches.undo()


@pytest.fixture(autouse=True)
def torch_threads():
    """torch's CPU threads as they were before each test: `check_args` sets `--torch-threads` (a GPU's default: one)
    for the process, `train` puts them back, and tests call `check_args` alone (the fuzzed flags: `--torch-threads 3`
    would leave a worker three threads on a core)."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def nvidia_gpus():
    """The GPUs that the NVIDIA driver lists (`nvidia-smi -L`), whatever torch makes of them."""
    smi = shutil.which("nvidia-smi")
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout if smi else ""
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in listed.splitlines() if line.startswith("GPU ")]


# The CUDA runs are skipped only where there is no GPU. Where the driver lists one that torch cannot use (a CPU-only
# torch build, a driver too old for this torch's CUDA), they run and fail, saying why, instead of passing as skipped.
# Tests that run `train()` inside pytest pass --device cpu: their subject is the logic, and the smoke harness, the
# exact resume, RND and the distributed tests are the ones that run on every device present.
GPU = torch.cuda.is_available() or bool(nvidia_gpus())
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not GPU, reason="no GPU"))]


# The tests run a narrow network: what they check (checkpoints, the features, the command line, the loop's batch and
# each loss term's sign and weight) does not depend on its size, and a full PPG run at the smoke sizes takes about a
# quarter of the time. The smoke tier and the tiers' parity (each file at its defaults) keep the default.
NARROW = ["--cnn-channels", "2"]  # one stack of 2 channels


def smoke_args(name, network=NARROW):
    """SMOKE_ARGS and what `name` needs on top: a full file takes its lean file's flags and `network`."""
    return [*SMOKE_ARGS, *SCRIPT_ARGS[name.removesuffix("_full")], *(network if name.endswith("_full") else [])]


def on_device(name, device):
    """`--device DEVICE`, and on a GPU a full file's eager plain loop, as the lean file's: its GPU defaults compile
    the stages with CUDA graphs (tests/test_gpu.py checks them), where these tests patch and count the eager ones."""
    eager = ["--compile", "off", "--rollout", "plain"] if device != "cpu" and name.endswith("_full") else []
    return ["--device", device, *eager]


def narrow_lean(script, monkeypatch, stacks=(2,)):
    """A lean file's network as NARROW asks a full file for it: the lean files have no flag for the stacks, so the
    test sets their `impala_cnn`'s argument (a full file is left as it is: its tests pass NARROW)."""
    if not script.__name__.endswith("_full"):
        monkeypatch.setattr(script, "impala_cnn", functools.partial(script.impala_cnn, stacks=stacks))


def parse(script, argv, **tyro_kwargs):
    """Args from `argv` as the script's entry point parses them: the full files' `parse_args` (one-line errors), or
    tyro.cli in the lean files (tyro's own message for a malformed flag)."""
    if hasattr(script, "plumbing"):
        return script.plumbing.parse_args(script.Args, argv, **tyro_kwargs)
    return tyro.cli(script.Args, args=argv, **tyro_kwargs)


def import_file(name, path):
    """Import the file at `path` as the module `name`, without running its `__main__` block. A full file imports a
    plumbing module of its own (its name in messages, PPG's `arch` among the network flags, the tests' patches), not
    the copy that another loaded full file uses."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    sys.modules.pop("plumbing", None)
    spec.loader.exec_module(module)
    return module


def load_script(name):
    """Import `ppo_procgen.py` (or a sibling) as a module, once."""
    return sys.modules[name] if name in sys.modules else import_file(name, ROOT / f"{name}.py")


def fork_server(env=None):
    """Start a fork server (tests/helpers/prefork.py) with `env` (this process's by default): the command of its
    client, which runs a Python file as `python FILE ARGS` would; None where the server does not start. Stopped at
    exit."""
    where = Path(tempfile.mkdtemp(prefix="prefork"))
    socket_path = where / "socket"
    serve = [sys.executable, str(ROOT / "tests" / "helpers" / "prefork.py"), "--serve", str(socket_path)]
    server = subprocess.Popen(serve, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
    atexit.register(lambda: server.kill() or server.wait() or shutil.rmtree(where, ignore_errors=True))
    deadline = time.time() + 120
    while not socket_path.exists() and server.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    client = [sys.executable, "-S", str(ROOT / "tests" / "helpers" / "prefork.py"), str(socket_path)]
    return client if socket_path.exists() else None


@functools.cache
def python():
    """The command that runs a Python file as `python FILE ARGS` would: this worker's fork server's client (the imports
    and procgen's start paid once a worker, a process of its own for each run), or `python` itself where no server
    starts or TESTS_NO_PREFORK=1 is set."""
    return (os.environ.get("TESTS_NO_PREFORK") != "1" and fork_server()) or [sys.executable]


@functools.cache
def routing():
    """The environment of a routed run and the command that starts its first file (see `routed`): this worker's second
    fork server, started with that environment (unbuffered, as the GPU kit runs its steps: a variable that Python
    reads at its start must be the server's)."""
    routed_path = [str(ROOT / "tests" / "helpers" / "routed"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(routed_path), "PYTHONUNBUFFERED": "1"}
    client = os.environ.get("TESTS_NO_PREFORK") != "1" and fork_server(env)
    return ({**env, "TESTS_FORK_SERVER": client[-1]}, client) if client else (env, [sys.executable])


def routed(cmd, at_start=None):
    """`cmd` (`python FILE ARGS`: a benchmark, whose processes start the scripts) and the environment to run it in, so
    that it and every `python FILE ARGS` that its processes start run through a fork server: the imports and
    procgen's start paid once a worker, not once a process (tests/helpers/routed). `at_start`: a file of code that
    each of those processes runs first, as a fresh one would run a `sitecustomize` (a planted fault). A routed
    process's resource usage, as its parent reads it, is its client's: the speed tables' peak memory is not checked."""
    env, client = routing()
    return [*client, *cmd[1:]], {**env, "TESTS_AT_START": str(at_start)} if at_start else env


def run_script(script, args, cwd, timeout=300):
    return subprocess.run(
        [*python(), str(ROOT / script), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def read_scalars(run_dir):
    """{tag: [(step, value), ...]} from every event file under `run_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def only_run_dir(cwd):
    run_dirs = list((Path(cwd) / "runs").iterdir())
    assert len(run_dirs) == 1, run_dirs
    return run_dirs[0]


def assert_trained(scalars, iterations, loss_tags=LOSS_TAGS):
    """Every iteration logged its losses, all finite, and the last update moved the policy."""
    for tag in loss_tags:
        assert len(scalars.get(tag, [])) == iterations, (tag, scalars.get(tag))
        assert all(math.isfinite(v) for _, v in scalars[tag]), (tag, scalars[tag])
    # approx_kl is measured after earlier minibatch steps of the same update: > 0 only if weights changed
    assert scalars["losses/approx_kl"][-1][1] > 0


@contextlib.contextmanager
def unwritable(path):
    """Make the directory `path` unwritable, for root too: mode 555, and the immutable flag where root ignores modes."""
    path.chmod(0o555)
    chattr = os.access(path, os.W_OK) and shutil.which("chattr")
    immutable = bool(chattr) and subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode == 0
    try:
        if os.access(path, os.W_OK):
            pytest.skip("no way to make a directory unwritable here: root without chattr")
        yield path
    finally:
        if immutable:
            subprocess.run([chattr, "-i", str(path)], check=True)
        path.chmod(0o755)


def outcome(script, argv):
    """What the entry point does with `argv` before training: (exit status, the lines written to stderr)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            defaults = (
                {"default": script.plumbing.cli_defaults(script.Args, argv)} if hasattr(script, "plumbing") else {}
            )
            script.check_args(parse(script, argv, **defaults))
            status = 0
        except SystemExit as exc:
            status = exc.code
    return status, stderr.getvalue().splitlines()


def file_size_limit(limit):
    """A subprocess's `preexec_fn` for a full disk or a quota: files stop at `limit` bytes, and a write past it fails
    with EFBIG ("File too large") instead of killing the process."""

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limited
