"""Run a script's `train()` on a clock that reads 1,800,000,000 s when it starts and runs a thousand times slower, so
that runs started together are named after the same second, as the runs of a sweep started in a loop often are:

    python tests/helpers/fixed_clock.py SCRIPT_NAME FLAGS...
"""

import importlib
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for conftest
conftest = importlib.import_module("conftest")  # imported after the path is set

script = conftest.load_script(sys.argv[1])
start = time.time()
clock = types.SimpleNamespace(**{**vars(time), "time": lambda: 1.8e9 + (time.time() - start) / 1000})
script.time = script.plumbing.time = clock  # the run's name is the plumbing's (torchrun's ranks agree on it)
script.train(conftest.parse(script, sys.argv[2:]))
