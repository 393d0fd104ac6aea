"""The vector env and gymnasium's wrappers around it, against hand sums of procgen's raw rewards and episode ends.

Procgen restarts a finished env inside the same step (SAME_STEP autoreset). Gymnasium's vector wrappers handle that
mode only from 1.4.0 on (PRs #1624 and #1668); with an older release these tests fail: every episode after an env's
first is logged one step short, and an episode's last reward leaks into the next one's running return.
"""

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import UV, load_script

SCRIPTS = ["ppo_procgen", "ppg_procgen"]
NUM_ENVS, NUM_STEPS, GAMMA = 6, 400, 0.9


def raw_and_wrapped(script, env_id, wrapper):
    """Two envs of one seed: the raw adapter, and the adapter under `wrapper`; the same actions go to both."""
    kwargs = dict(env_name=env_id, num_levels=200, start_level=0, distribution_mode="easy", num_threads=1)
    make = lambda: script.ProcgenVecEnv(NUM_ENVS, 3, **kwargs)  # noqa: E731
    return make(), wrapper(make())


def play(raw, wrapped, on_step):
    rng = np.random.default_rng(0)
    raw.reset(seed=3)
    wrapped.reset(seed=3)
    for _ in range(NUM_STEPS):
        actions = rng.integers(0, 15, NUM_ENVS)
        _, reward, done, _, _ = raw.step(actions)
        _, wrapped_reward, wrapped_done, _, infos = wrapped.step(actions)
        assert np.array_equal(done, wrapped_done)  # one seed, one action stream: the same games
        on_step(reward, done, wrapped_reward, infos)


@pytest.mark.parametrize("name", SCRIPTS)
def test_episode_statistics_are_the_hand_sums_of_every_episode(name):
    script = load_script(name)
    import gymnasium as gym

    raw, wrapped = raw_and_wrapped(script, "starpilot", gym.wrappers.vector.RecordEpisodeStatistics)
    running_return, running_length = np.zeros(NUM_ENVS), np.zeros(NUM_ENVS, dtype=int)
    expected, logged = [], []

    def on_step(reward, done, _, infos):
        running_return[:] += reward
        running_length[:] += 1
        for i in np.nonzero(done)[0]:  # the step that ends an episode counts in it; the next starts the next one
            expected.append((i, running_return[i], running_length[i]))
            running_return[i], running_length[i] = 0, 0
        episodes = []
        script.log_episodes(episodes, infos, 0, "")
        logged.extend(zip(np.nonzero(infos.get("_episode", []))[0], [r for *_, r, _ in episodes],
                          [n for *_, n in episodes], strict=True))  # fmt: skip

    play(raw, wrapped, on_step)
    assert len(expected) > 2 * NUM_ENVS  # several episodes per env: the second and later ones are the ones at risk
    assert [(i, float(r), int(n)) for i, r, n in logged] == [(i, float(r), int(n)) for i, r, n in expected]


@pytest.mark.parametrize("name", SCRIPTS)
def test_running_return_of_reward_normalisation_restarts_with_each_episode(name):
    script = load_script(name)
    import gymnasium as gym

    normalise = lambda env: gym.wrappers.vector.NormalizeReward(env, gamma=GAMMA)  # noqa: E731
    raw, wrapped = raw_and_wrapped(script, "starpilot", normalise)
    running, samples = np.zeros(NUM_ENVS), []

    def on_step(reward, done, normalised, _):
        # the discounted return so far of the episode in progress; gymnasium's update drops the discount's carry at
        # the step that ends an episode (its `1 - terminated` factor), so that step's sample is its reward alone
        running[:] = np.where(done, 0.0, GAMMA * running) + reward
        samples.append(running.copy())
        running[done] = 0.0  # the next step is the first of a new episode: nothing of this one carries over
        np.testing.assert_allclose(wrapped.accumulated_reward, running, rtol=1e-5)
        np.testing.assert_allclose(normalised, reward / np.sqrt(wrapped.return_rms.var + wrapped.epsilon), rtol=1e-6)

    play(raw, wrapped, on_step)
    samples = np.concatenate(samples)
    assert (samples > 0).any()  # rewards did arrive
    # every step of every env is one sample of the running statistics (none skipped after an episode end)
    assert wrapped.return_rms.count == pytest.approx(1e-4 + NUM_STEPS * NUM_ENVS)
    assert wrapped.return_rms.mean == pytest.approx(samples.mean(), rel=1e-6)
    assert wrapped.return_rms.var == pytest.approx(samples.var(), rel=1e-4)


def other_python(version="3.13"):
    """A python3.13 on PATH or under pyenv, or None."""
    candidates = [shutil.which(f"python{version}")]
    pyenv = os.path.expanduser(os.environ.get("PYENV_ROOT", "~/.pyenv"))
    candidates += sorted(glob.glob(f"{pyenv}/versions/{version}*/bin/python{version}"))
    for python in filter(None, candidates):
        probe = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
        )
        if probe.returncode == 0 and probe.stdout.strip() == str(tuple(map(int, version.split(".")))):
            return python
    return None


def test_python_313_package_steps_like_this_pythons(request, tmp_path_factory):
    """procgen-gym (Python 3.13, numpy 2) against this Python's procgen package: same seed and actions, the same
    observations, rewards, episode ends and game states, bit for bit. Its venv holds the env package and numpy."""
    python = other_python()
    if python is None:
        pytest.skip("no Python 3.13 on this machine (PATH or pyenv)")
    if sys.version_info[:2] == (3, 13):
        pytest.skip("this Python is 3.13 already: there is no second package to compare with")
    cache = getattr(request.config, "cache", None)  # none with `-p no:cacheprovider` (tests/mutate.py runs so)
    venv = Path(cache.mkdir("py313-procgen-gym") if cache else tmp_path_factory.mktemp("py313-procgen-gym"))
    venv_python = venv / "bin" / "python"
    if not venv_python.exists() or subprocess.run([venv_python, "-c", "import procgen_gym"]).returncode != 0:
        # uv installs where it is there (a tenth of pip's time, mostly the venv's own pip that it skips), else pip
        subprocess.run([python, "-m", "venv", "--clear", *["--without-pip"] * bool(UV), str(venv)], check=True)
        # the env package and what it imports, without the plotting and video extras its metadata asks for
        pip = [venv_python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        if UV:
            pip = [UV, "pip", "install", "-q", "--python", venv_python]
        subprocess.run([*pip, "--no-deps", "procgen-gym==0.1.1"], check=True)
        subprocess.run([*pip, "numpy>=2", "gymnasium>=1.4", "filelock"], check=True)
    stream = str(Path(__file__).parent / "helpers" / "env_stream.py")
    here, there = (subprocess.run([p, stream], capture_output=True, text=True) for p in (sys.executable, venv_python))
    assert here.returncode == 0 and there.returncode == 0, (here.stderr[-2000:], there.stderr[-2000:])
    (digest, states, episodes, *_), (digest313, states313, *versions) = here.stdout.split(), there.stdout.split()
    assert int(episodes) > 4 and "numpy 2." in " ".join(versions)
    assert (digest, states) == (digest313, states313)
