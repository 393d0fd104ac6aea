"""A fork server for the tests' script processes. A script's process spends about 5 s on a 2-core machine before it
trains: importing torch, gymnasium and tensorboard, the optimizer's first import of torch._dynamo, and procgen's first
game (its assets). The server pays that once per pytest worker and forks a process for each run that starts where a
fresh `python SCRIPT ARGS` would be once its imports are done; the script then runs top to bottom as `__main__`.

    python tests/helpers/prefork.py --serve SOCKET            # the server (conftest.py starts one per worker)
    python -S tests/helpers/prefork.py SOCKET SCRIPT ARGS...  # what a test runs instead of `python SCRIPT ARGS`
    python -S tests/helpers/prefork.py SOCKET -m MODULE ARGS  # or -c CODE ARGS: as `python -m` and `python -c`

The second form is a small client that the test starts as its process (pipes, a closed stream, cwd, environment, a
preexec_fn's file size limit, signals, timeouts all work as with `python SCRIPT ARGS`): it hands its standard streams,
working directory, environment and file-size limit to the server, forwards the signals it receives to the forked
process, and exits as that process exited (with its status, or by its signal). The forked process is a real interpreter:
it ends as Python ends (flushing its streams, atexit, the exit status of an uncaught exception or of Ctrl-C). Where the
environment differs from the server's in a variable read when the packages are imported (threads, allocators, CUDA,
Python's own), or no server answers, the client runs `python SCRIPT ARGS` itself."""

import json
import os
import signal
import socket
import struct
import sys

# read at import time by torch, OpenMP, glibc or Python: a run that sets one of these needs a process of its own
IMPORT_TIME_ENV = ("OMP_", "MKL_", "KMP_", "GOMP_", "PYTORCH", "TORCH", "CUDA", "NVIDIA", "LD_", "MALLOC_", "GLIBC_",
                   "PYTHON")  # fmt: skip
# but these, which torchrun sets for its workers and torch.distributed reads when the process group is made
RUN_TIME_ENV = ("TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def run_here(argv):
    os.execv(sys.executable, [sys.executable, *argv])


def client(path, argv):
    import resource

    closed = [fd for fd in (0, 1, 2) if not is_open(fd)]  # a stream the test closed (`>&-`): closed in the run too
    for fd in closed:  # held by /dev/null meanwhile, so that the socket below does not take its number
        os.dup2(os.open(os.devnull, os.O_RDWR), fd)
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        request = json.dumps({
            "argv": argv,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
            "closed": closed,
        }).encode()  # fmt: skip
        socket.send_fds(conn, [struct.pack("!I", len(request)) + request], [0, 1, 2])
        reply = conn.makefile("r")
        pid = reply.readline().strip()
    except OSError:
        pid = ""
    if not pid.isdigit():  # no server, or this run needs a process of its own
        for fd in closed:
            os.close(fd)
        run_here(argv)
    pid = int(pid)
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, frame: os.kill(pid, signum))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the forked process holds the streams alone: a reader sees their end when it ends
        os.dup2(devnull, fd)
    status = int(reply.readline())
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status))


def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def preload():
    """What every script imports, and procgen's first game (its threads end with it): paid here once."""
    import contextlib
    import io

    import gymnasium  # noqa: F401
    import numpy  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch, and what the optimizer's first call imports)
    import torch.distributed  # noqa: F401
    import tyro  # noqa: F401
    from torch.utils.tensorboard import SummaryWriter  # noqa: F401

    with contextlib.redirect_stderr(io.StringIO()):  # the old `gym` that procgen imports prints a notice
        try:
            from procgen import ProcgenGym3Env as Procgen
        except ImportError:
            Procgen = None  # procgen-gym (Python 3.13): its games start quickly
    if Procgen is not None:
        Procgen(num=1, env_name="starpilot", num_levels=1, start_level=0, distribution_mode="easy").close()


def serve(path):
    """Fork a process for each client; tell the client its exit status; kill it if its client dies first (a test's
    timeout). Ends when the worker that started it ends."""
    import gc
    import select
    import threading

    env_at_import = dict(os.environ)
    preload()
    gc.collect()
    # what the imports made goes to the collector's permanent generation: a forked process's collections, the last one
    # at its exit included, walk only what it made itself (a run's exit 0.9 s -> 0.3 s; its pages stay shared)
    gc.freeze()
    # no Python thread left running, which a forked process would lose (OpenBLAS's idle pool, which numpy may start,
    # shuts itself down around a fork)
    assert threading.active_count() == 1, threading.enumerate()
    set_by_imports = {key: value for key, value in os.environ.items() if key not in env_at_import}
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)  # ready
    clients = {}  # the forked process's pid: its client's connection
    while os.getppid() == parent:
        ready, _, _ = select.select([listener, *clients.values()], [], [], 0.05)
        if listener in ready and (request := accept(listener, env_at_import, set_by_imports)) is not None:
            conn, fds, request = request
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for other in [listener, conn, *clients.values()]:
                    other.close()
                return become(fds, request, set_by_imports)
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            clients[pid] = conn
        for pid, conn in list(clients.items()):
            if conn in ready:  # the client's connection ended before its process: the client was killed
                try_to(os.kill, pid, signal.SIGKILL)
                conn.close()
                del clients[pid]
        while True:  # the processes that ended: their status to their clients
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in clients:
                try_to(clients[pid].sendall, f"{status}\n".encode())
                clients.pop(pid).close()
    for pid in clients:  # the worker is gone
        try_to(os.kill, pid, signal.SIGKILL)
    sys.exit(0)


def try_to(fn, *args):
    try:
        fn(*args)
    except OSError:  # the process or the connection is gone already
        pass


def accept(listener, env_at_import, set_by_imports):
    """(the connection, the client's three streams, its request), or None where the run needs a process of its own:
    where a variable read at import time differs from the server's, but for those that the imports themselves set
    (torch's inductor sets its cache directory), which the client's environment may or may not have yet."""
    conn, _ = listener.accept()
    fds = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        size = struct.unpack("!I", data[:4])[0]
        data = data[4:]
        while len(data) < size:
            data += conn.recv(size - len(data))
        request = json.loads(data)
        env = request["env"]
    except (OSError, ValueError, struct.error, KeyError):  # not a client of ours, or one that went away
        env = None
    # what each process's environment holds once its imports are done (the forked one's: become())
    server, fresh = {**env_at_import, **set_by_imports}, {**set_by_imports, **(env or {})}
    differs = env is None or any(
        server.get(k) != fresh.get(k)
        for k in {*server, *fresh}
        if k.startswith(IMPORT_TIME_ENV) and not k.startswith(RUN_TIME_ENV)
    )
    if differs or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        try_to(conn.sendall, b"no\n")
        conn.close()
        return None
    return conn, fds, request


def become(fds, request, set_by_imports):
    """In the forked process: the client's streams, directory, environment (with what the imports set in it, as they
    would have in a process of its own) and file-size limit; the script's argv and path."""
    import resource

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for fd in request["closed"]:  # as Python starts with a stream closed: the descriptor free, the stream None
        os.close(fd)
        setattr(sys, ("stdin", "stdout", "stderr")[fd], None)
        setattr(sys, ("__stdin__", "__stdout__", "__stderr__")[fd], None)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**set_by_imports, **request["env"]})
    resource.setrlimit(resource.RLIMIT_FSIZE, tuple(request["fsize"]))  # Python ignores SIGXFSZ in both processes
    # argv as Python sets it at the start (`-m MODULE ARGS`, `-c CODE ARGS`: "-m" or "-c", then ARGS), and sys.path[0]
    # (the script's directory; for `-m` the working directory, for `-c` "")
    sys.argv = request["argv"]
    what = (sys.argv[0], sys.argv.pop(1) if sys.argv[0] in ("-m", "-c") else sys.argv[0])
    paths = {"-m": os.getcwd(), "-c": ""}
    sys.path[0] = paths[what[0]] if what[0] in paths else os.path.dirname(os.path.abspath(sys.argv[0]))
    # what a `sitecustomize` does at each process's start, where it asks for it (tests/helpers/routed): again here
    getattr(sys.modules.get("sitecustomize"), "at_start", lambda: None)()
    return what


def run(kind, target):
    """In the forked process: the script, the module (`-m`) or the code (`-c`), whose uncaught exceptions end it as
    they would end `python ...`."""
    import runpy
    import types

    if kind == "-m":  # its path becomes argv[0], as Python does
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif kind == "-c":
        sys.modules["__main__"] = types.ModuleType("__main__")  # a namespace of its own
        exec(compile(target, "<string>", "exec"), vars(sys.modules["__main__"]))
    else:
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        run(*serve(sys.argv[2]))
    else:
        client(sys.argv[1], sys.argv[2:])
