"""The shared smoke harness: every script, on every device present, for a few hundred steps."""

import pytest
from conftest import DEVICES, SMOKE_ARGS, assert_trained, only_run_dir, read_scalars, run_script

# one entry per script (and per variant of it worth a smoke run): (script, extra flags)
SCRIPTS = [
    pytest.param("ppo_procgen.py", [], id="ppo"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("script,extra", SCRIPTS)
def test_smoke(tmp_path, script, extra, device):
    proc = run_script(script, [*SMOKE_ARGS, "--device", device, *extra], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = read_scalars(only_run_dir(tmp_path))
    assert_trained(scalars, iterations=2)
    assert [step for step, _ in scalars["charts/SPS"]] == [128, 256]
    # random starpilot episodes last about 75 steps: both the train and the test envs finish some
    assert scalars["charts/episodic_return"] and scalars["charts/test_episodic_return"]
