"""Run by test_distributed.py under `torchrun --nproc_per_node 2`: RND's running statistics across processes.

Each of 2 processes sees 2 of 4 envs for 8 steps and updates its RND statistics. The reference is one process that
sees all 4 envs. Every process must end with the reference's observation and return statistics, and so with the same
statistics as the other process (rank 0's checkpoint then fits every process). Rank 0 writes JSON: the largest
difference to the reference, and between the processes.
"""

import json
from pathlib import Path

import torch
import torch.distributed as dist
from ddp_setup import load_and_join

script, out_path, rank, world = load_and_join()
g = torch.Generator().manual_seed(1)
T, E = 8, 4
obs = torch.randint(0, 256, (T, E, 64, 64, 3), dtype=torch.uint8, generator=g)
next_obs = torch.randint(0, 256, (T, E, 64, 64, 3), dtype=torch.uint8, generator=g)
STATS = ("obs_mean", "obs_var", "obs_count", "return_mean", "return_var", "return_count")


def statistics(num_envs, world_size, envs):
    torch.manual_seed(0)  # the same target and predictor everywhere
    rnd = script.RND(num_envs, gamma=0.99, world_size=world_size)
    for _ in range(2):  # two rollouts: the second merges into statistics that already hold a count
        rnd.intrinsic_reward(obs[:, envs], next_obs[:, envs], chunk=4)
    return torch.cat([getattr(rnd, key).flatten().double() for key in STATS])


mine = statistics(E // world, world, slice(rank * E // world, (rank + 1) * E // world))
reference = statistics(E, 1, slice(None))
everyone = [torch.zeros_like(mine) for _ in range(world)]
dist.all_gather(everyone, mine)
if rank == 0:
    scale = reference.abs().clamp(min=1)
    result = {
        "to_reference": ((mine - reference).abs() / scale).max().item(),
        "between": max(((other - mine).abs() / scale).max().item() for other in everyone),
    }
    Path(out_path).write_text(json.dumps(result))
dist.destroy_process_group()
