"""Run by test_features.py under `torchrun --nproc_per_node 2`: a full file's `train()` on scripted games, with the
flags after SCRIPT_NAME OUT_PATH. Each process writes OUT_PATH.rank{N}.json: its run's name, for each of its vector
envs (training, then test) the seed it was made with and the episodes its games finished, the seeds it gave torch's
generator, and the names of the threads left once `train()` returned."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from ddp_setup import load
from scripted_env import Recorder

script, out_path = load()
recorder = Recorder(script, pytest.MonkeyPatch())
seeded, manual_seed = [], torch.manual_seed
torch.manual_seed = lambda seed: seeded.append(int(seed)) or manual_seed(seed)
run_name = script.train(script.plumbing.parse_args(script.Args, sys.argv[3:]))
made = type(recorder.train_env).made


def thread_name(task):
    """The thread's name, or None where it ended between the listing and the read (a thread on its way out)."""
    try:
        return Path(f"/proc/self/task/{task}/comm").read_text().strip()
    except FileNotFoundError:
        return None


threads = [name for name in map(thread_name, os.listdir("/proc/self/task")) if name is not None]
result = {"run_name": run_name, "seeds": [env.rand_seed for env in made], "episodes": [len(env.starts) for env in made],
          "threads": threads, "torch_seeds": seeded}  # fmt: skip
Path(f"{out_path}.rank{os.environ['RANK']}.json").write_text(json.dumps(result))
