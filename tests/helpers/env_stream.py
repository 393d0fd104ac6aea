"""Print a digest of procgen's stream for one seed and one action sequence, through whichever procgen package this
Python has. tests/test_env.py runs it under two interpreters (two packages) and compares the digests."""

import hashlib
import sys

import numpy as np

NUM_ENVS, NUM_STEPS, SEED = 4, 300, 5


def main():
    kwargs = dict(num_levels=200, start_level=0, distribution_mode="easy", rand_seed=SEED, num_threads=1)
    try:
        from procgen import ProcgenGym3Env  # procgen, procgen-mirror: Python 3.10 to 3.12

        env = ProcgenGym3Env(NUM_ENVS, "starpilot", **kwargs)

        def step(actions):
            env.act(actions)
            reward, obs, first = env.observe()
            return obs["rgb"], reward, first

    except ImportError:
        from procgen_gym import ProcgenVecEnv  # procgen-gym: Python 3.13

        env = ProcgenVecEnv(NUM_ENVS, "starpilot", **kwargs)

        def step(actions):
            obs, reward, first, _, _ = env.step(actions)
            return obs, reward, first

    digest, episodes = hashlib.sha256(), 0
    for t in range(NUM_STEPS):  # a fixed action sequence that needs no random generator of either numpy
        obs, reward, first = step(((t * 7 + np.arange(NUM_ENVS) * 3 + t // 5) % 15).astype(np.int32))
        for array in (obs, np.asarray(reward, np.float32), np.asarray(first, bool)):
            digest.update(np.ascontiguousarray(array).tobytes())
        episodes += int(np.sum(first))
    states = hashlib.sha256(b"".join(env.get_state())).hexdigest()  # what a checkpoint keeps of the games
    print(digest.hexdigest(), states, episodes, f"numpy {np.__version__}", f"Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
