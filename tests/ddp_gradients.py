"""Run by test_distributed.py under `torchrun --nproc_per_node 2`: one update step on a fixed batch, three ways.

Every process builds the same network and the same batch of 4 envs x 8 steps. The reference is one process
with all 4 envs (normalised over the whole batch, no communication). The data-parallel step gives each of the
2 processes 2 envs, normalises with the global statistics and all-reduces the gradients. Two controls leave out
one of the two (local normalisation; no all-reduce) and must differ from the reference. Rank 0 writes JSON.
"""

import json
from pathlib import Path

import torch
import torch.distributed as dist
import tyro
from ddp_setup import load_and_join

script, out_path, rank, world = load_and_join()
args = tyro.cli(script.Args, args=["--num-envs", "4", "--num-steps", "8"])
torch.manual_seed(0)
agent = script.Agent((64, 64, 3), 15, args.feature_dim, args.init_fn, *([args.arch] if hasattr(args, "arch") else []))
g = torch.Generator().manual_seed(1)
T, E = 8, 4
obs = torch.randint(0, 256, (T, E, 64, 64, 3), dtype=torch.uint8, generator=g)
actions = torch.randint(0, 15, (T, E), generator=g)
logprobs = torch.log(torch.full((T, E), 1 / 15)) + 0.1 * torch.randn(T, E, generator=g)
values, returns = torch.randn(T, E, generator=g), torch.randn(T, E, generator=g)
advantages = 3.0 + 2.0 * torch.randn(T, E, generator=g)  # far from zero mean: normalisation matters


def gradients(envs, normalise, all_reduce):
    agent.zero_grad()
    b = lambda x: x[:, envs].reshape(-1)  # noqa: E731 - the flattened batch of these envs
    b_adv = b(advantages)
    mean, std = normalise(b_adv)
    b_adv = (b_adv - mean) / (std + 1e-8)
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs[:, envs].reshape(-1, 64, 64, 3), b(actions))
    pg_loss = script.clipped_policy_loss(newlogprob - b(logprobs), b_adv, args.clip_coef).mean()
    v_loss = script.clipped_value_loss(newvalue.view(-1), b(values), b(returns), args.clip_range_vf).mean()
    loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
    loss.backward()
    if all_reduce:
        script.all_reduce_grads(agent.parameters(), world)
    return torch.cat([p.grad.reshape(-1) for p in agent.parameters() if p.grad is not None])


mine = list(range(rank * E // world, (rank + 1) * E // world))
reference = gradients(list(range(E)), lambda x: (x.mean(), x.std()), all_reduce=False)
data_parallel = gradients(mine, lambda x: script.global_mean_std(x, world), all_reduce=True)
local_norm = gradients(mine, lambda x: (x.mean(), x.std()), all_reduce=True)
no_reduce = gradients(mine, lambda x: script.global_mean_std(x, world), all_reduce=False)
rel = lambda g: ((g - reference).abs().max() / reference.abs().max()).item()  # noqa: E731
if rank == 0:
    Path(out_path).write_text(json.dumps({"data_parallel": rel(data_parallel), "local_norm": rel(local_norm),
                                          "no_reduce": rel(no_reduce)}))  # fmt: skip
dist.destroy_process_group()
