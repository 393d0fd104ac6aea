"""What the scripts run by the tests under torchrun share: the script named on the command line, loaded as a module,
and (for the checks that do not run `train()`, which joins by itself) the gloo process group joined."""

import importlib.util
import sys
from pathlib import Path

import torch.distributed as dist


def load():
    """(script module, output path) for `python FILE.py SCRIPT_NAME OUT_PATH ...`."""
    name, out_path, root = sys.argv[1], sys.argv[2], Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))  # where a full file finds plumbing.py
    spec = importlib.util.spec_from_file_location(name, root / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script, out_path


def load_and_join():
    """(script module, output path, rank, world size), the process group joined."""
    script, out_path = load()
    dist.init_process_group("gloo")
    return script, out_path, dist.get_rank(), dist.get_world_size()
