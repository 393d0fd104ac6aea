"""What the scripts run by test_distributed.py under torchrun share: the script named on the command line, loaded
as a module, and the gloo process group joined."""

import importlib.util
import sys
from pathlib import Path

import torch.distributed as dist


def load_and_join():
    """(script module, output path, rank, world size) for `python FILE.py SCRIPT_NAME OUT_PATH` under torchrun."""
    name, out_path = sys.argv[1], sys.argv[2]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    dist.init_process_group("gloo")
    return script, out_path, dist.get_rank(), dist.get_world_size()
