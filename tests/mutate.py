"""Mutation check: one-line mistakes in the scripts, each applied alone to a copy of the repository, must each make the
tests of that script fail: the lean files' mistakes against the fast tests of the loop and the math, the full files'
against the tests of their features. Not part of the suite (it runs the tests once per mistake); run it after changing
the scripts or the tests:

    python tests/mutate.py              # every mistake against its tests
    python tests/mutate.py -k kl        # the mistakes whose description contains "kl" ("kl|lock": either)
    python tests/mutate.py --file plumbing.py   # the mistakes in one file
    python tests/mutate.py --tests tests/test_math.py tests/test_ppg.py tests/test_env.py tests/test_smoke.py
                                        # against other tests: here, the suite as it was before test_loop.py

It runs one mistake per core at a time (`--jobs`), each in a copy of its own, its tests in one pytest process with
one torch thread (no pytest-xdist workers to start for each mistake). It prints one line per mistake, killed or
survived, as each ends, and exits 1 if any survived (or if the unchanged copy fails).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAST_TESTS = ["tests/test_math.py", "tests/test_ppg.py", "tests/test_loop.py"]
FEATURE_TESTS = ["tests/test_features.py", "tests/test_fuzz.py", "tests/test_host_syncs.py"]
# the tests of one lean script: those of the other scripts and of the full files' options are left out
OPTIONS = "not full and not vtrace and not prio and not rnd and not bf16 and not python_313"
PPO, PPG, PPO_FULL, PPG_FULL = "ppo_procgen.py", "ppg_procgen.py", "ppo_procgen_full.py", "ppg_procgen_full.py"
PLUMBING = "plumbing.py"  # the full files' plumbing: its mistakes run the tests of both full files
TESTS = {  # each file's tests: the test files, and pytest's -k for the cases of that file alone
    PPO: (FAST_TESTS, f"not ppg and {OPTIONS}"),
    PPG: (FAST_TESTS, f"not ppo_procgen and not ppo- and {OPTIONS}"),
    PPO_FULL: (FEATURE_TESTS, "ppo_procgen_full"),
    PPG_FULL: (FEATURE_TESTS, "ppg_procgen_full"),
    PLUMBING: (FEATURE_TESTS, "full"),
}

# the tests of the checkpoints' and the run directory's safeguards, for the mistakes that name them
RESUME_TESTS = (["tests/test_checkpoint.py"], "older or unreadable_newest or second_run or stale or restarted_torchrun "
                "or other_script or rotation")  # fmt: skip

# the tests of what a run was asked to keep: a full disk (the checkpoints', the model's) and a removed run directory
KEPT_TESTS = (["tests/test_checkpoint.py", "tests/test_no_traceback.py"], "full_disk or status_4 or removed")

# the tests that a run's network has the flags' channels, and that a checkpoint of other channels is refused
NETWORK_TESTS = (["tests/test_checkpoint.py"], "bad_checkpoints or evaluation")

# the GPU's defaults (--compile auto, --rollout auto), as check_args settles them on the run's device
FAST_PATH_TESTS = (["tests/test_cuda_paths.py"], "fast_path")

# PPG told to stop at its phase's end (a campaign's chunks): a signal mid-phase, and one in the auxiliary phase
PHASE_END_TESTS = (["tests/test_checkpoint.py"], "told_to_stop", "any case")

# the compiled stages' test, for the mistakes in --compile
COMPILE_TESTS = (["tests/test_compile.py"], "compiled")

# the tiers' parity at one seed (its cases are named after the lean file), for the mistakes that a full file alone
# can make in the lean file's arithmetic
TIER_TESTS = {
    full: (["tests/test_tiers.py"], f"bit_identical and {lean}", "any case")
    for full, lean in (("ppo_procgen_full.py", "not ppg"), ("ppg_procgen_full.py", "ppg_procgen"))
}

# RND's intrinsic reward: the errors computed, then the rollout's observations merged (the mistake swaps the two)
RND_ERRORS = """        flat = next_obs_seq.flatten(0, 1)
        error = torch.cat([self.prediction_error(flat[i : i + chunk]) for i in range(0, len(flat), chunk)])
        error = error.view(next_obs_seq.shape[:2])
"""
RND_MERGE = """        flat = obs.flatten(0, 1)
        for i in range(0, len(flat), chunk):
            self.merge(self.obs_mean, self.obs_var, self.obs_count, flat[i : i + chunk].permute((0, 3, 1, 2)).float())
"""

# (file, the line's text as it is, the mistake, what it breaks[, (test files, -k) in place of the file's own]); the
# text must occur once in the file
MUTANTS = [
    *[(lean, 'with torch.random.fork_rng([device] if device.type == "cuda" else []):', "with contextlib.nullcontext():",
       f"{lean[:3].upper()}: the test envs' actions drawn from the training generator") for lean in (PPO, PPG)],
    *[(full, "torch.manual_seed(args.seed + 7919 * args.rank + 1_000_003 + iteration)", "pass",
       f"{full[:3].upper()} full: a folded rollout's test noise not from the test loop's generator") for full in
      (PPO_FULL, PPG_FULL)],
    *[(full, "    torch.manual_seed(args.seed)  # one seed, one result", "    pass",
       f"{full[:3].upper()} full: --eval-only not seeded") for full in (PPO_FULL, PPG_FULL)],
    *[(full, "self.intrinsic_return.mul_(self.gamma)", "self.intrinsic_return.mul_(0.99)",
       f"{full[:3].upper()} full: RND's running return with a discount of its own",
       (["tests/test_rnd.py"], "discounts")) for full in (PPO_FULL, PPG_FULL)],
    *[(full, RND_ERRORS + RND_MERGE, RND_MERGE + RND_ERRORS,
       f"{full[:3].upper()} full: RND's rewards from the statistics the rollout updated", (["tests/test_rnd.py"],
       "discounts")) for full in (PPO_FULL, PPG_FULL)],
    *[(file, "aux_mbs % max(args.n_aux_grad_accum, 1) == 0",
       "args.num_envs * args.n_iteration % (args.num_aux_rollouts * args.n_aux_grad_accum) == 0",
       f"{file[:3].upper()}{' full' * ('full' in file)}: a phase of fewer rollouts than --num-aux-rollouts refused",
       (["tests/test_smoke.py"], "cleanrl")) for file in (PPG, PPG_FULL)],
    *[(PPG_FULL, old, new, f"PPG full: {what}", (["tests/test_compile.py"], "once", "any case")) for old, new, what in [
        ("for group in optimizer.param_groups for p in group[\"params\"] if p not in optimizer.state)",
         "for group in optimizer.param_groups for p in group[\"params\"] if False)",
         "Adam's states made at their first step: the compiled step recompiles after the auxiliary phase"),
        ("        policy_kl(torch.zeros(1, 2), torch.zeros(1, 2))\n", "        pass\n",
         "the KL's dispatch table filled inside the compiled auxiliary minibatch: it recompiles"),
    ]],
    *[(full, 'if args.compile == "reduce-overhead" and args.world_size > 1:', "if False:",
       f"{full[:3].upper()} full: --compile reduce-overhead under torchrun", (["tests/test_cli.py"], "cuda_graphs"))
      for full in (PPO_FULL, PPG_FULL)],
    (PPG_FULL, 'if args.n_aux_grad_accum > 1 and args.compile == "reduce-overhead":', "if False:",
     "PPG full: --n-aux-grad-accum with CUDA graphs", (["tests/test_cli.py"], "cuda_graphs")),
    (PPG_FULL, 'plumbing.console(f"phase {iteration // self.args.n_iteration}/{self.args.num_phases}  {losses}")',
     'print(f"phase {iteration // self.args.n_iteration}/{self.args.num_phases}  {losses}", flush=True)',
     "PPG full: the phase's line, the first write to a closed console, ends the run",
     (["tests/test_no_traceback.py"], "phase_line")),
    (PPO_FULL, 'group["lr"], group["eps"], group["capturable"] = lr, args.adam_eps, False',
     'group["lr"], group["eps"] = lr, args.adam_eps',
     "PPO full: a compiled GPU run's capturable Adam resumed on a CPU", (["tests/test_checkpoint.py"], "compiled_gpu")),
    (PPG_FULL, 'group["lr"], group["eps"], group["capturable"] = lr, args.adam_eps, False',
     'group["lr"], group["eps"] = lr, args.adam_eps', "PPG full: a compiled GPU run's capturable Adam resumed on a CPU",
     (["tests/test_checkpoint.py"], "compiled_gpu")),
    *[(PPG_FULL, old, new, f"PPG full: {what}", PHASE_END_TESTS) for old, new, what in [
        ("signum = signum if phase_end or not args.stop_at_phase_end else 0", "pass",
         "--stop-at-phase-end: a signal mid-phase writes the phase's rollouts"),
        ("signum = 0 if self.args.stop_at_phase_end else self.run.signalled()", "signum = self.run.signalled()",
         "--stop-at-phase-end: a signal in the auxiliary phase stops after its epoch"),
    ]],
    (PPO, "loss = pg_loss - args.ent_coef * entropy_loss", "loss = pg_loss + args.ent_coef * entropy_loss",
     "entropy bonus with its sign flipped"),
    (PPO, "loss = pg_loss - args.ent_coef", "loss = -pg_loss - args.ent_coef", "policy loss with its sign flipped"),
    (PPO, "+ v_loss * args.vf_coef", "- v_loss * args.vf_coef", "value loss with its sign flipped"),
    (PPO, "+ v_loss * args.vf_coef", "+ v_loss * 0", "value loss weighted by zero"),
    (PPO, "logratio = newlogprob - mb_logprobs", "logratio = mb_logprobs - newlogprob", "ratio inverted"),
    (PPO, "    optimizer.zero_grad()\n    loss.backward()", "    loss.backward()", "zero_grad removed"),
    (PPO, "next_value = agent.get_value(next_obs)", "next_value = agent.get_value(obs[-1])",
     "bootstrap value on the last stored observation, not the one after it"),
    (PPO, "dones[step] = next_done", "dones[step] = 0", "episode ends dropped from the stored batch"),
    (PPO, "dones[step] = next_done", "dones[step - 1] = next_done", "episode ends shifted one step earlier"),
    (PPO, "rewards[step] = torch.as_tensor", "rewards[step - 1] = torch.as_tensor",
     "rewards shifted one step earlier than their observations"),
    (PPO, "obs[step] = next_obs", "obs[step - 1] = next_obs", "observations shifted one step against the actions"),
    (PPO, "clipped_policy_loss(logratio, mb_advantages, args.clip_coef)",
     "clipped_policy_loss(logratio, -mb_advantages, args.clip_coef)", "advantages with their sign reversed"),
    (PPO, "clipped_policy_loss(logratio, mb_advantages, args.clip_coef)",
     "clipped_policy_loss(logratio, mb_advantages, 1e9)", "clip range ignored"),
    (PPO, "mb_returns, args.clip_range_vf)", "mb_values, args.clip_range_vf)",
     "value loss toward the old values, not the returns"),
    (PPO, "b_advantages = (b_advantages - b_mean) / (b_std + 1e-8)", "b_advantages = b_advantages - b_mean",
     "advantages centred but not scaled"),
    (PPO, "1_000_003, 0, 0, args)", "1_000_003, args.num_levels, args.start_level, args)",
     "test envs on the training levels"),
    (PPO, "return action, logprob, value.flatten()", "return action, logprob, value.flatten().roll(1)",
     "values stored against another env's observation"),
    (PPG, "kl_loss = policy_kl(m_logits, new_pi.logits)", "kl_loss = policy_kl(new_pi.logits, m_logits)",
     "PPG: KL in the reverse direction"),
    (PPG, "args.beta_clone * kl_loss", "0 * kl_loss", "PPG: KL term weighted by zero"),
    (PPG, "for x in (aux_obs, aux_returns, aux_logits)]", "for x in (aux_obs, aux_returns.flip(1), aux_logits)]",
     "PPG: auxiliary targets misaligned with their observations"),
    (PPG, "aux_returns[:, slot : slot + envs.num_envs] = returns",
     "aux_returns[:, slot : slot + envs.num_envs] = values",
     "PPG: the buffer stores values in place of returns"),
    (PPG, "slot = (iteration - 1) % args.n_iteration", "slot = 0", "PPG: every iteration overwrites the first slot"),
    (PPG, "loss + pg_loss - args.ent_coef * entropy_loss", "loss + pg_loss + args.ent_coef * entropy_loss",
     "PPG: entropy bonus with its sign flipped"),
    (PPG, "logratio = newlogprob - mb_logprobs", "logratio = mb_logprobs - newlogprob", "PPG: ratio inverted"),
    *[(full, old, new, f"{full[:3].upper()} full: V-trace's {what} a view taken under no_grad of a tensor that requires"
       " grad (AOTAutograd in torch 2.11 cannot compile it)", (["tests/test_compile.py"], "options")) for full in
      (PPO_FULL, PPG_FULL) for old, new, what in [("ratio.detach()))", "ratio))", "ratios"),
                                                  ("newvalue.detach()[:, 0]", "newvalue[:, 0]", "refreshed values")]],
    (PPO_FULL, "return self.action if self.folded else action.cpu().numpy()", "return action.cpu().numpy()",
     "PPO full: a folded step's actions copied back twice", (["tests/test_host_syncs.py"], "rollout_step", "any case")),
    (PPG, "    optimizer.zero_grad()\n    loss.backward()", "    loss.backward()",
     "PPG: zero_grad removed from the policy phase"),
    (PPG, "1_000_003, 0, 0, args)", "1_000_003, args.num_levels, args.start_level, args)",
     "PPG: test envs on the training levels"),
    (PPG, "loss = loss + v_loss * args.vf_coef", "loss = loss + v_loss * 0", "PPG: value loss weighted by zero"),
    *[(full, old, new, f"{full[:3].upper()} full: {what}") for full in (PPO_FULL, PPG_FULL) for old, new, what in [
        ("args.gae_lambda, rho, *clips)", "args.gae_lambda)",
         "V-trace's minibatch advantages without the ratios (GAE)"),
        ('vtrace[-1].index_copy_(0, mb_inds, stats.pop("vtrace_values"))', 'stats.pop("vtrace_values")',
         "V-trace: the values never refreshed after a minibatch"),
        ('rho_clipped.add_(stats.pop("vtrace_rho_clipped"))', 'stats.pop("vtrace_rho_clipped")',
         "V-trace: the clipped ratios never counted"),
        ("mb_returns = mb_advantages + mb_values", "pass", "V-trace: the value targets the rollout's GAE returns"),
        ("else agent.get_value(next_obs).reshape(1, -1)", "else next_value",
         "V-trace: the bootstrap value not refreshed at an epoch's start"),
        ("mb_advantages = (mb_advantages - mb_mean) / (mb_std + 1e-8)", "pass",
         "V-trace: a minibatch's advantages not normalised"),
        ("draws = np.stack([np.random.choice(n, size, replace=False,", "draws = np.stack([np.random.choice(n, size,",
         "prioritised segments drawn with replacement"),
        ("* args.prio_alpha * (iteration - 1) / args.num_iterations",
         "* (iteration - 1) / max(1, args.num_iterations - 1)", "prioritised sampling's beta annealed to 1"),
        ("gamma=args.norm_reward_gamma or args.gamma)", "gamma=args.gamma)", "--norm-reward-gamma ignored"),
        ("mb_advantages.std(correction=0) + 1e-8)", "mb_advantages.std() + 1e-8)",
         "--norm-adv-minibatch divides by the sample std, not numpy's (PPO2's)"),
        ("    if args.norm_adv_minibatch:\n", "    if False:\n", "--norm-adv-minibatch ignored"),
        ("advantages.abs().sum(0).cpu().numpy()", "torch.ones_like(advantages).sum(0).cpu().numpy()",
         "prioritised sampling with uniform priorities"),
        ("args.clip_coef), mb_weights", "args.clip_coef), None", "importance weights dropped from the policy loss"),
        ("args.clip_range_vf).mean()", "args.clip_range_vf).mul(mb_weights if mb_weights is not None else 1).mean()",
         "importance weights on the value loss too"),
        ("loss = loss + rnd_loss", "loss = loss + 0 * rnd_loss", "RND's predictor loss weighted by zero"),
        ("RND(args.local_num_envs, args.intrinsic_gamma,", "RND(args.local_num_envs, args.gamma,",
         "RND's intrinsic return discounted with the training discount"),
        ("    if args.intrinsic_coef > 0 and not run.ckpt:", "    if False:",
         "RND's observation statistics not warmed up"),
        ("        next_obs, next_done = warm_up_rnd(", "        warm_up_rnd(",
         "the first rollout starts from the games as they were before RND's warm-up"),
        ("rewards.mul_(0.0 if args.pretraining else 1.0)", "rewards.mul_(1.0)",
         "pretraining keeps the game's reward"),
        ("dtype=torch.bfloat16):", "dtype=torch.bfloat16, enabled=False):", "bf16 autocast switched off"),
        ("if args.eval_train_levels else (0, 0)", "if False else (0, 0)",
         "--eval-only --eval-train-levels on the test levels"),
        ("env_seed, test_envs, test_obs = args.seed + 7919 * args.rank,", "env_seed, test_envs, test_obs = args.seed,",
         "torchrun: every process on the same levels"),
        ("itertools.chain(*gather_objects(episodes, args.world_size))", "episodes",
         "torchrun: only rank 0's episodes logged"),
        ("lambda v, a: 0 <= v <= 256", "lambda v, a: True", "--env-threads' rule allows everything"),
        ("self.test_noise[self.t])[0]", "self.noise[self.t, : len(self.test_obs)])[0]",
         "a folded rollout's test envs' actions drawn from the training envs' noise"),
        ("mb_returns = mb_advantages + mb_values",
         "mb_returns = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8) + mb_values",
         "V-trace: the value targets from normalised advantages"),
        (".view(args.num_minibatches, -1)\n", ".view(-1, args.num_minibatches).T\n",
         "V-trace: the segments not in Metta's order"),
        ('refreshed = batch["values"].clone() if', 'refreshed = batch["values"] if',
         "V-trace: explained variance from the refreshed values"),
        ("torch.manual_seed(env_seed + 1_000_003 + iteration)", "torch.manual_seed(args.seed + 1_000_003 + iteration)",
         "torchrun: every process's test envs draw the same actions' noise"),
        ("does nothing either\n        return self", "does nothing either\n        return None",
         "torchrun: the other ranks' writer has no file writer for the episodes"),
        ("approx_kl = ((ratio - 1) - logratio).mean()",
         "approx_kl = torch.tensor(((ratio - 1) - logratio).mean().item())",
         "approx_kl read back by the host every minibatch"),
    ]],
    *[(full, old, new, f"{full[:3].upper()} full: {what}", RESUME_TESTS) for full in (PPO_FULL, PPG_FULL)
      for old, new, what in [
        ("newer = [p for p in found if", "newer = [p for p in found if False and",
         "a resume from an older checkpoint leaves the newer ones in place"),
        ("if not (kept and os.path.exists(kept) and os.path.samefile(old, kept)):", "if True:",
         "rotation deletes the checkpoint the run resumed from"),
        ("if os.path.basename(p) < name]", "]", "rotation by name over every checkpoint, newer ones included"),
        ("fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)", "f.fileno()", "the run directory's lock never taken"),
        ("        os.remove(tmp)\n", "        pass\n", "a stale .tmp checkpoint left in place"),
        ('/checkpoints/*.tmp") + glob.glob(f"{glob.escape(run_dir)}/*.tmp"):', '/checkpoints/*.tmp"):',
         "a stale .tmp model file (a `--save-model` write cut short) left in place"),
        ('and Path(d, "torchrun_job").read_text() == owner]', "]", "a torchrun restart takes any run of its name"),
        ('glob.glob(f"{glob.escape(folder)}/', 'glob.glob(f"{folder}/',
         "a run directory's name read as a glob pattern (`--exp-name 'lr[1e-3]'`)"),
    ]],
    *[(full, old, new, f"{full[:3].upper()} full: {what}", COMPILE_TESTS) for full in (PPO_FULL, PPG_FULL)
      for old, new, what in [
        ('    if args.compile == "off":\n        return stages', "    if True:\n        return stages",
         "--compile compiles nothing"),
        ("fallback_random = True", "fallback_random = False", "the compiled stages draw from inductor's own generator"),
        ('group["lr"].fill_(lr)', "pass", "a compiled run's learning rate never annealed"),
    ]],
    *[(full, old, new, f"{full[:3].upper()} full: {what}", TIER_TESTS[full]) for full in (PPO_FULL, PPG_FULL)
      for old, new, what in [
        ("index_select(dim, inds)", "index_select(dim, inds.sort().values)", "a minibatch gathered in sorted order"),
        ('(("return", r), ("length", l))', '(("return", l), ("length", r))', "an episode's return and length swapped"),
    ]],
    *[(full, old, new, f"{full[:3].upper()} full: {what}", KEPT_TESTS) for full in (PPO_FULL, PPG_FULL)
      for old, new, what in [
        ('NOT_WRITTEN.get(run_dir, {}).pop("checkpoint", None)', "pass",
         "a checkpoint written after a failed one does not clear the failure"),
        ("    if missed:\n        raise SystemExit(4)", "    if missed:\n        pass",
         "a run without its last checkpoint or model file exits with status 0"),
        ("if not os.path.isdir(run_dir):  # removed mid-run", "if False:  # removed mid-run",
         "a checkpoint makes a removed run directory again"),
        ("threading.excepthook = quiet\n", "pass\n",
         "TensorBoard's writer thread prints its traceback when the run directory is removed"),
        ('NOT_WRITTEN.setdefault(os.path.dirname(model_path), {})["model"] = model_path', "pass",
         "a model file not written ends the run with status 0"),
    ]],
    # the message comes from the file that resumes the other script's run: the test case named after the run's script
    *[(full, "if other != SCRIPT:  # before", "if False:  # before",
       f"{full[:3].upper()} full: the other script's checkpoint not named", (*RESUME_TESTS, "any case"))
      for full in (PPO_FULL, PPG_FULL)],
    *[(full, old, new, f"{full[:3].upper()} full: {what}", NETWORK_TESTS) for full, old, new, what in [
        (PPO_FULL, '"hidden_dim", "cnn_channels")', '"hidden_dim")', "a checkpoint of other --cnn-channels resumed"),
        (PPO_FULL, "args.hidden_dim, args.cnn_channels)  # fmt", "args.hidden_dim)  # fmt",
         "the trained network ignores --cnn-channels"),
        (PPG_FULL, "self.value_network = impala_cnn(obs_shape, feature_dim, init_fn, cnn_channels)",
         "self.value_network = impala_cnn(obs_shape, feature_dim, init_fn)",
         "dual's value network ignores --cnn-channels"),
    ]],
    # the plumbing's own lines, written once: a mistake there is made once
    *[(PLUMBING, old, new, f"full: {what}", FAST_PATH_TESTS) for old, new, what in [
        ('args.rollout = "folded" if gpu else "plain"', 'args.rollout = "plain"', "a GPU's default rollout is plain"),
        ('gpu = args.device.startswith("cuda") and args.world_size == 1', 'gpu = args.device.startswith("cuda")',
         "torchrun's processes compile with CUDA graphs by default"),
        ('if gpu and getattr(args, "n_aux_grad_accum", 1) == 1 else "off"', 'if gpu else "off"',
         "PPG's gradients accumulated across calls get CUDA graphs by default"),
        ('args.torch_threads or (1 if args.device.startswith("cuda") else 0)', "args.torch_threads",
         "a GPU run keeps torch's CPU threads on every core"),
        ("        torch.set_num_threads(args.torch_threads)", "        pass", "--torch-threads never set"),
    ]],
    (PLUMBING, "(0 if had_events else None)", "0",
     "full: a new run's events file holds a purge marker (a resume within the same second loses its events)",
     (["tests/test_checkpoint.py"], "same_second", "any case")),
    (PLUMBING, "            torch.set_num_threads(threads)", "            pass",
     "full: torch's CPU threads not put back when `train` ends", (["tests/test_cli.py"], "process_settings")),
    (PLUMBING, "            self.envs.unwrapped.act_ahead(self.action)", "            pass",
     "full: a folded rollout's training envs wait for the test envs' forward pass",
     (["tests/test_features.py"], "folded_rollout_logs")),
    (PLUMBING, "steps = [torch.empty((num_envs, actions), device=device).exponential_() for _ in "
     "range(args.num_steps)]", "steps = torch.empty((args.num_steps, num_envs, actions), device=device).exponential_()",
     "full: a folded rollout's noise drawn in one tensor (a GPU's generator gives other numbers)",
     (["tests/test_features.py"], "folded_rollout_logs")),
    (PLUMBING, "self.seconds[part] = self.seconds.get(part, 0.0) + now - self.last",
     "self.seconds[part] = now - self.last", "full: the perf timers keep the last step's seconds alone",
     (["tests/test_features.py"], "perf_timers")),
    (PLUMBING, "        except BlockingIOError:  # held by another process", "        except OSError:",
     "full: a lock file that a full disk refuses taken for another run's",
     (["tests/test_no_traceback.py"], "under_the_logs")),
    (PLUMBING, "if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or not HELD:", "if True:",
     "full: a full disk under the logs ends in a traceback", (["tests/test_no_traceback.py"], "under_the_logs")),
    (PLUMBING, 'docs[field.target.id] = " ".join(doc.value.value.split())', "docs[field.target.id] = doc.value.value",
     "full: --help shows a docstring's line breaks, lines cut short", (["tests/test_cli.py"], "wraps_each")),
    (PLUMBING, "except OSError as exc:  # a full disk, a file-size limit: one line, as for the directory",
     "except FileExistsError as exc:", "full: a torchrun job's mark that a full disk refuses ends in a traceback",
     (["tests/test_no_traceback.py"], "under_the_logs")),
    (PLUMBING, "if done.returncode == 0 and not done.stderr:", "if done.returncode == 0:",
     "full: a video that a full disk cut short said to be written",
     (["tests/test_no_traceback.py"], "video_that", "any case")),
    (PLUMBING, "capture_output=True, restore_signals=False)", "capture_output=True)",
     "full: ffmpeg killed by a file-size limit, its reason lost",
     (["tests/test_no_traceback.py"], "video_that", "any case")),
    (PLUMBING, "    if why:\n        arg_error(\"capture-video\"", "    if False:\n        arg_error(\"capture-video\"",
     "full: --capture-video where no ffmpeg runs starts, a traceback at the first video",
     (["tests/test_no_traceback.py"], "no_ffmpeg_runs")),
    (PLUMBING, "    exe, why = ffmpeg()\n", "    exe, why = ffmpeg()[0] or \"ffmpeg\", None\n",
     "full: ffmpeg gone during a run ends it in a traceback at the next video",
     (["tests/test_no_traceback.py"], "no_ffmpeg_runs")),
    (PLUMBING, "    with contextlib.suppress(OSError):\n        print(f\"{SCRIPT}.py: {text}\"",
     "    if True:\n        print(f\"{SCRIPT}.py: {text}\"",
     "full: a warning or an error that a full stderr refuses ends the run with status 1",
     (["tests/test_no_traceback.py"], "standard_error")),
]  # fmt: skip


def in_their_file(mutants):
    """Each mistake where its line is: a line of the full files' that lives in the plumbing is one mistake there, made
    once for both files (the first of the pair, with its own tests), and named `full: ...`."""
    placed, plumbing = {}, (ROOT / PLUMBING).read_text()
    for file, old, new, what, *own in mutants:
        if file in (PPO_FULL, PPG_FULL) and old not in (ROOT / file).read_text() and old in plumbing:
            file, what = PLUMBING, "full: " + what.split(": ", 1)[1]
        placed.setdefault((file, old, new), (file, old, new, what, *own))
    return list(placed.values())


MUTANTS = in_their_file(MUTANTS)


def run_tests(copy, file, tests=None, own=None):
    """The tests of `file` on the copy: its own test files (`own`: a mistake's own), or `tests` where given."""
    default, only = TESTS[file]
    if own:  # the mistake's own tests: the cases of this file among them, or ("any case") all of them
        default, only = own[0], own[1] if own[2:] == ("any case",) else f"({own[1]}) and {only}"
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "0", *(tests or default), "-k",
           only]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one core's worth of threads: the mistakes run side by side
    return subprocess.run(cmd, cwd=copy, capture_output=True, text=True, env=env)


def fresh_copy(into):
    for name in (PPO, PPG, PPO_FULL, PPG_FULL, PLUMBING, "pyproject.toml"):
        shutil.copy(ROOT / name, into / name)
    shutil.copytree(ROOT / "tests", into / "tests", ignore=shutil.ignore_patterns("__pycache__"))


def stale(mutants):
    """The mistakes whose line is not in their file exactly once (the code moved on), each said in words."""
    found = [(file, old, what) for file, old, _, what, *_ in mutants if (ROOT / file).read_text().count(old) != 1]
    return [f"{what}: the line `{old.strip()}` is not in {file} exactly once" for file, old, what in found]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-k", default="", help="only the mistakes whose description contains this text (or one of "
                        "several, as in 'kl|rotation')")  # fmt: skip
    parser.add_argument("--file", help="only the mistakes in this file (plumbing.py, ppo_procgen_full.py, ...)")
    parser.add_argument("--tests", nargs="+", help="the test files to run on each copy (default: each file's own)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="mistakes at a time (default: one per core)")
    opts = parser.parse_args()
    chosen = [m for m in MUTANTS if any(k.lower() in m[3].lower() for k in opts.k.split("|"))]
    chosen = [m for m in chosen if opts.file in (None, m[0])]
    for what in stale(chosen):
        sys.exit(f"{what}; update the list")
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(opts.jobs) as pool:
        copies = [Path(tmp) / str(i) for i in range(opts.jobs)]
        for copy in copies:
            copy.mkdir()
            fresh_copy(copy)
        free = list(copies)  # the copies no mistake is using

        def run_on_a_copy(file, text, *own):
            """`file`'s tests on a free copy whose `file` reads `text` (a mistake, or the file as it is)."""
            copy = free.pop()
            try:
                (copy / file).write_text(text)
                return run_tests(copy, file, opts.tests, *own)
            finally:
                (copy / file).write_text((ROOT / file).read_text())
                free.append(copy)

        def unchanged(file):  # the unchanged copy passes, or no mistake could be told from it
            proc = run_on_a_copy(file, (ROOT / file).read_text())
            if proc.returncode != 0:
                raise SystemExit(f"the unchanged {file} fails its fast tests:\n{proc.stdout[-2000:]}")

        list(pool.map(unchanged, sorted({m[0] for m in chosen})))

        def check(mutant):
            file, old, new, what, *own = mutant
            begun = time.time()
            proc = run_on_a_copy(file, (ROOT / file).read_text().replace(old, new), *own)
            failed = [line.split(" ")[1] for line in proc.stdout.splitlines() if line.startswith("FAILED")]
            # a test failed (1; under pytest-xdist, where --tests' files may ask for it, -x ends the session as
            # interrupted: 2, with the failure named); 0 is a survivor, anything else an error of the run
            killed = proc.returncode == 1 or (proc.returncode == 2 and bool(failed))
            status = "killed" if killed else ("SURVIVED" if proc.returncode == 0 else f"error {proc.returncode}")
            print(f"{status:8}  {file:19}  {what}  ({time.time() - begun:.0f}s{', by ' + failed[0] if failed else ''})",
                  flush=True)  # fmt: skip
            return killed

        survived = [m[3] for m, killed in zip(chosen, pool.map(check, chosen), strict=True) if not killed]
    print(f"{len(chosen) - len(survived)} of {len(chosen)} killed in {(time.time() - started) / 60:.1f} min")
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
