"""Run by test_distributed.py under `torchrun --nproc_per_node 2`: two checks in one process group (a launch of
torchrun and two processes importing torch costs more than both checks).

1. One update step on a fixed batch, three ways. Every process builds the same network and the same batch of 4 envs x
   8 steps. The reference is one process with all 4 envs (normalised over the whole batch, no communication). The
   data-parallel step gives each of the 2 processes 2 envs, normalises with the global statistics and all-reduces the
   gradients. Two controls leave out one of the two (local normalisation; no all-reduce) and must differ from the
   reference.
2. RND's running statistics (full files). Each process sees 2 of the 4 envs for 8 steps and updates its RND
   statistics; the reference is one process that sees all 4. Every process must end with the reference's observation
   and return statistics, and so with the other process's (rank 0's checkpoint then fits every process).

Rank 0 writes JSON: each way's largest difference to its reference, and between the processes' RND statistics.
"""

import json
from pathlib import Path

import torch
import torch.distributed as dist
import tyro
from ddp_setup import load_and_join

script, out_path, rank, world = load_and_join()
T, E = 8, 4
mine = slice(rank * E // world, (rank + 1) * E // world)  # this process's envs

# 1. the gradient of one update step
args = tyro.cli(script.Args, args=["--num-envs", "4", "--num-steps", "8"])
torch.manual_seed(0)
agent = script.Agent((64, 64, 3), 15, args.feature_dim, args.init_fn, *([args.arch] if hasattr(args, "arch") else []))
g = torch.Generator().manual_seed(1)
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
        script.plumbing.all_reduce_grads(agent.parameters(), world)
    return torch.cat([p.grad.reshape(-1) for p in agent.parameters() if p.grad is not None])


reference = gradients(slice(None), lambda x: (x.mean(), x.std()), all_reduce=False)
rel = lambda g: ((g - reference).abs().max() / reference.abs().max()).item()  # noqa: E731
result = {
    "data_parallel": rel(gradients(mine, lambda x: script.plumbing.global_mean_std(x, world), all_reduce=True)),
    "local_norm": rel(gradients(mine, lambda x: (x.mean(), x.std()), all_reduce=True)),
    "no_reduce": rel(gradients(mine, lambda x: script.plumbing.global_mean_std(x, world), all_reduce=False)),
}

# 2. RND's statistics
next_obs = torch.randint(0, 256, (T, E, 64, 64, 3), dtype=torch.uint8, generator=g)
STATS = ("obs_mean", "obs_var", "obs_count", "return_mean", "return_var", "return_count")


def statistics(num_envs, world_size, envs):
    torch.manual_seed(0)  # the same target and predictor everywhere
    rnd = script.RND(num_envs, gamma=0.99, world_size=world_size)
    for _ in range(2):  # two rollouts: the second merges into statistics that already hold a count
        rnd.intrinsic_reward(obs[:, envs], next_obs[:, envs], chunk=4)
    return torch.cat([getattr(rnd, key).flatten().double() for key in STATS])


own = statistics(E // world, world, mine)
rnd_reference = statistics(E, 1, slice(None))
everyone = [torch.zeros_like(own) for _ in range(world)]
dist.all_gather(everyone, own)
scale = rnd_reference.abs().clamp(min=1)
result["rnd_to_reference"] = ((own - rnd_reference).abs() / scale).max().item()
result["rnd_between"] = max(((other - own).abs() / scale).max().item() for other in everyone)
if rank == 0:
    Path(out_path).write_text(json.dumps(result))
dist.destroy_process_group()
