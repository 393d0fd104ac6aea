"""A scripted stand-in for procgen, and recorders of what `train()` does with it.

`ScriptedProcgen` replaces the `Procgen` class of a loaded script, so the script's own `ProcgenVecEnv` adapter (and its
same-step reset), gymnasium's wrappers and `train()` run unchanged around it. Its observations say which env made them
and at which step: pixel (0, 0) holds (env instance, env index, step % 256) and pixel (0, 1) holds step // 256, so a
test reads any stored observation back to the transition it came from. Rewards and episode ends follow a script.
"""

import copy

import numpy as np
import torch


class Script:
    """What the scripted games do: by default an episode of env i ends at every step c with (c + i) % 5 == 4, and the
    reward of acting in (env i, step c) is c + 100 i + 1000 instance, unique to that transition."""

    def ends(self, instance, i, c):
        return (c + i) % 5 == 4

    def reward(self, instance, i, c, action):
        return float(c + 100 * i + 1000 * instance)

    def cue(self, instance, i, c):
        """The value of every pixel but the two that carry the ids."""
        return 0


class Bandit(Script):
    """A contextual bandit: each observation is all bright or all dark; action 0 pays on bright, action 1 on dark.
    Every episode is one step long."""

    def ends(self, instance, i, c):
        return True

    def bright(self, i, c):
        return (c * 7 + i * 3) % 2 == 0

    def cue(self, instance, i, c):
        return 255 if self.bright(i, c) else 0

    def reward(self, instance, i, c, action):
        return float(action == (0 if self.bright(i, c) else 1))


def ids(obs):
    """(instance, env index, step) of each observation in a batch (any leading shape)."""
    obs = torch.as_tensor(obs).to(torch.int64)
    return obs[..., 0, 0, 0], obs[..., 0, 0, 1], obs[..., 0, 0, 2] + 256 * obs[..., 0, 1, 0]


class ScriptedProcgen:
    """procgen's gym3 interface (`act`, `observe`) over scripted games. Every instance is kept in `made`, with the
    arguments it received, the action each observation got (`acted`) and the observations that start an episode
    after an earlier one ended (`starts`)."""

    script = Script()
    made = []

    def __init__(self, num, rand_seed, **kwargs):
        self.instance, self.num, self.rand_seed, self.kwargs = len(self.made), num, rand_seed, kwargs
        self.made.append(self)
        self.step_of = np.zeros(num, dtype=np.int64)  # the step of the observation each env shows now
        self.reward, self.first = np.zeros(num, dtype=np.float32), np.ones(num, dtype=bool)
        self.acted, self.starts = {}, set()

    def obs(self):
        out = np.empty((self.num, 64, 64, 3), dtype=np.uint8)
        for i, c in enumerate(self.step_of):
            out[i] = self.script.cue(self.instance, i, c)
            out[i, 0, 0] = (self.instance, i, c % 256)
            out[i, 0, 1, 0] = c // 256
        return out

    def observe(self):
        return self.reward.copy(), {"rgb": self.obs()}, self.first.copy()

    def act(self, actions):
        for i, (c, action) in enumerate(zip(self.step_of, actions, strict=True)):
            self.acted[(i, int(c))] = int(action)
            self.reward[i] = self.script.reward(self.instance, i, c, int(action))
            self.first[i] = self.script.ends(self.instance, i, c)  # the same step shows the next episode's start
            if self.first[i]:
                self.starts.add((i, int(c) + 1))
        self.step_of += 1


class Recorder:
    """Wraps a loaded script for one `train()` call: its games scripted, and the calls that `train()` makes to the
    agent and the loss helpers recorded, each with its inputs and outputs, in order."""

    def __init__(self, script, monkeypatch, game=None, init=None):
        self.script, self.calls, self.agents = script, [], []
        ScriptedProcgen.made.clear()
        scripted = type("Scripted", (ScriptedProcgen,), {"script": game or Script(), "made": ScriptedProcgen.made})
        monkeypatch.setattr(script, "Procgen", scripted)
        recorder, base = self, script.Agent

        class RecordingAgent(base):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                if init:  # a test's change to the freshly built agent, before its weights are kept as the initial ones
                    init(self)
                self.initial = copy.deepcopy(self.state_dict())  # the weights before any update
                recorder.agents.append(self)

            def get_action_and_value(self, x, action=None, **noise):  # a full file's folded rollout: its noise
                out = super().get_action_and_value(x, action, **noise)
                recorder.calls.append(("act" if action is None else "update", x, [o.detach() for o in out]))
                return out

            def get_value(self, x):
                out = super().get_value(x)
                recorder.calls.append(("value", x, out.detach()))
                return out

        monkeypatch.setattr(script, "Agent", RecordingAgent)
        for name in ("compute_gae", "clipped_policy_loss", "clipped_value_loss", "auxiliary_phase", "policy_kl"):
            if hasattr(script, name):
                monkeypatch.setattr(script, name, self.spy(name, getattr(script, name)))

    def spy(self, name, function):
        def recorded(*args, **kwargs):
            if name == "auxiliary_phase":  # the agent as the phase finds it, before any auxiliary step
                self.calls.append(("before_aux", copy.deepcopy(args[0]), None))
            out = function(*args, **kwargs)
            saved = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
            self.calls.append((name, saved, out))
            return out

        return recorded

    def of(self, kind):
        return [(inputs, outputs) for name, inputs, outputs in self.calls if name == kind]

    @property
    def train_env(self):
        return ScriptedProcgen.made[0]
