"""The shared smoke harness: every script, on every device present, for a few hundred steps."""

import math

import pytest
from conftest import AUX_TAGS, DEVICES, assert_trained, only_run_dir, read_scalars, run_script, smoke_args

# one entry per script and variant worth a smoke run: (script, extra flags, tags logged once per phase)
SCRIPTS = [
    pytest.param("ppo_procgen", [], [], id="ppo"),
    pytest.param("ppg_procgen", ["--arch", "dual"], AUX_TAGS, id="ppg-dual"),
    pytest.param("ppg_procgen", ["--arch", "shared"], AUX_TAGS, id="ppg-shared"),
    pytest.param("ppg_procgen", ["--arch", "detach", "--init-fn", "orthogonal"], AUX_TAGS, id="ppg-detach"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,extra,phase_tags", SCRIPTS)
def test_smoke(tmp_path, name, extra, phase_tags, device):
    proc = run_script(f"{name}.py", [*smoke_args(name), "--device", device, *extra], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = read_scalars(only_run_dir(tmp_path))
    assert_trained(scalars, iterations=2)
    assert [step for step, _ in scalars["charts/SPS"]] == [128, 256]
    for tag in phase_tags:  # one full auxiliary phase ran, at the end of iteration 2
        assert [step for step, _ in scalars.get(tag, [])] == [256], tag
        assert math.isfinite(scalars[tag][0][1]), tag
    # random starpilot episodes last about 75 steps: both the train and the test envs finish some
    assert scalars["charts/episodic_return"] and scalars["charts/test_episodic_return"]
