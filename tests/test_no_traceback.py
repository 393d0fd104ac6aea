"""No traceback, round two: sizes that cannot fit in memory, a console that goes away, Ctrl-C, and a full disk at the
final model write. Each ends in one line (or quietly), and what was already written stays."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from conftest import (
    ROOT,
    file_size_limit,
    load_script,
    only_run_dir,
    outcome,
    parse,
    python,
    read_scalars,
    smoke_args,
)

SCRIPTS = ["ppo_procgen_full", "ppg_procgen_full"]  # the lean files stop the common mistakes alone (test_cli.py)
# sizes that are each legal but together need far more memory than any machine the tests run on: (flags, named)
TOO_LARGE = [
    (["--num-envs", "4096", "--num-steps", "4096"], ["--num-envs 4096", "--num-steps 4096"]),  # a 206 GB rollout
    (["--num-envs", "1024", "--num-minibatches", "1"], ["--num-envs 1024", "--num-minibatches 1"]),  # activations
    (["--num-eval-envs", "65536", "--num-envs", "65536"], ["--num-eval-envs 65536"]),  # procgen's games
]
PPG_TOO_LARGE = [(["--n-iteration", "4096", "--num-steps", "256"], ["--n-iteration 4096"])]  # an 824 GB phase buffer


def check(script, argv):
    """What the entry point does with `argv` at the smoke sizes, before training: (exit status, the stderr lines)."""
    return outcome(script, [*smoke_args(script.SCRIPT), "--device", "cpu", *argv])


@pytest.mark.parametrize("name", SCRIPTS)
def test_sizes_that_cannot_fit_are_one_line_naming_them(name):
    script = load_script(name)
    for argv, named in TOO_LARGE + (PPG_TOO_LARGE if "ppg" in name else []):
        status, lines = check(script, [*argv, "--total-timesteps", str(2**50)])  # a run that holds those sizes
        assert status == 2 and len(lines) == 1, (argv, lines)
        assert lines[0].startswith(f"{name}.py: error: --") and re.search(r"need \d+\.\d GiB on cpu", lines[0])
        assert all(flag in lines[0] for flag in named), (argv, lines)


@pytest.mark.parametrize("name", SCRIPTS)
def test_sizes_near_the_free_memory_warn_and_start(name, monkeypatch):
    """With the host's free memory set around what the smoke run needs: refused below it, warned just above it."""
    script = load_script(name)
    monkeypatch.setattr(script.plumbing, "host_memory", lambda: 0.0)
    status, lines = check(script, [])
    need = float(re.search(r"need (\d+\.\d) GiB", lines[0])[1]) * 2**30
    assert status == 2 and len(lines) == 1
    monkeypatch.setattr(
        script.plumbing, "host_memory", lambda: 1.2 * need
    )  # over 75% taken: a warning, and the run starts
    status, lines = check(script, [])
    assert status == 0 and len(lines) == 1 and lines[0].startswith(f"{name}.py: warning: --num-envs 4 x --num-steps")
    monkeypatch.setattr(script.plumbing, "host_memory", lambda: 2 * need)
    assert check(script, []) == (0, [])


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_into_a_reader_that_closes_exits_quietly(name):
    """`--help | head -1`: the reader goes before the help is written (at once), or after one line (three times, as
    the race that made it intermittent would have it)."""
    for read_first in (False, True, True, True):
        proc = subprocess.Popen([*python(), str(ROOT / f"{name}.py"), "--help"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)  # fmt: skip
        if read_first:
            assert proc.stdout.readline()
        proc.stdout.close()
        assert proc.wait(timeout=120) == 0 and proc.stderr.read() == b""


@pytest.mark.parametrize("name", ["ppo_procgen_full"])
def test_a_run_whose_console_closes_trains_on(name, tmp_path):
    flags = [*smoke_args(name), "--device", "cpu"]
    proc = subprocess.Popen([*python(), str(ROOT / f"{name}.py"), *flags], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert "logs in runs/" in proc.stdout.readline()
    proc.stdout.close()  # the reader goes away after the first line
    assert proc.wait(timeout=300) == 0
    assert proc.stderr.read() == ""
    assert len(read_scalars(only_run_dir(tmp_path))["losses/policy_loss"]) == 2  # every iteration logged


@pytest.mark.parametrize("name", ["ppg_procgen_full"])
def test_a_console_that_closes_before_the_phase_line_leaves_the_run_to_finish(name, tmp_path):
    """The reader goes away after the last iteration's line, so that the auxiliary phase's line is the first write
    that fails: the run still ends as it should (its model written, status 0, nothing on stderr)."""
    command = [*python(), str(ROOT / f"{name}.py"), *smoke_args(name), "--device", "cpu", "--save-model"]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not proc.stdout.readline().startswith("iter 2/2"):
        pass
    proc.stdout.close()
    assert proc.wait(timeout=300) == 0
    assert proc.stderr.read() == ""
    assert (only_run_dir(tmp_path) / f"{name}.cleanrl_model").is_file()


@pytest.mark.parametrize("name", ["ppg_procgen_full"])
def test_a_console_that_fails_to_write_leaves_the_run_training(name, tmp_path):
    """Standard output on a full disk (/dev/full: every write fails with ENOSPC), not a closed pipe: the run trains,
    logs every iteration and exits 0, with nothing on stderr."""
    flags = [*smoke_args(name), "--device", "cpu"]
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*python(), str(ROOT / f"{name}.py"), *flags], cwd=tmp_path, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert len(read_scalars(only_run_dir(tmp_path))["losses/policy_loss"]) == 2  # every iteration logged


@pytest.mark.parametrize("name", SCRIPTS)
def test_standard_error_that_fails_to_write_changes_no_outcome(name, tmp_path):
    """Standard error on a full disk too (/dev/full): a warning that cannot be written leaves the run training to its
    end (status 0, every iteration logged), and a bad flag still exits with status 2, not 1 with a traceback."""
    command = [*python(), str(ROOT / f"{name}.py"), *smoke_args(name), "--device", "cpu"]
    with open("/dev/full", "w") as full:
        warned = subprocess.run([*command, "--learning-rate", "0.05"], cwd=tmp_path, stderr=full, timeout=600)
        refused = subprocess.run([*command, "--total-timesteps", "1"], cwd=tmp_path, stderr=full, timeout=600)
    assert (warned.returncode, refused.returncode) == (0, 2)
    assert len(read_scalars(only_run_dir(tmp_path))["losses/policy_loss"]) == 2  # every iteration logged


@pytest.mark.parametrize("name", SCRIPTS)
def test_apple_s_mps_is_refused_in_one_line(name):
    """float64 rewards fail on MPS at the first step: the flag is refused before anything starts."""
    status, lines = check(load_script(name), ["--device", "mps"])
    assert status == 2 and lines == [f"{name}.py: error: --device mps: must be auto, cpu, cuda or cuda:N (not mps)"]


@pytest.mark.parametrize(
    "name,limit,job",
    [("ppo_procgen_full", 0, None), ("ppg_procgen_full", 0, "job7"), ("ppg_procgen_full", 2_500, None)],
)
def test_a_full_disk_under_the_logs_is_one_line_saying_so(name, limit, job, tmp_path):
    """Files limited to `limit` bytes: at 0 the run directory's lock file (the machine and the process) is the first
    write to fail, before anything starts (status 2, not a run said to be going on there), or under a named torchrun
    job the directory's mark of the job, written before it; at 2,500 the TensorBoard events, as the run goes (status
    4: the run stopped at its next write, saying what it keeps)."""
    command = [*python(), str(ROOT / f"{name}.py"), *smoke_args(name), "--device", "cpu"]
    limited = dict(capture_output=True, text=True, timeout=300, preexec_fn=file_size_limit(limit))
    env = {**os.environ, **({"TORCHELASTIC_RUN_ID": job} if job else {})}  # torchrun's name for the job
    proc = subprocess.run(command, cwd=tmp_path, env=env, **limited)
    run_dir = f"runs/{only_run_dir(tmp_path).name}"
    if limit == 0:  # nothing started
        written = "torchrun_job file" if job else "lock file"
        status, line = 2, f"--exp-name: {run_dir}: cannot write its {written}: File too large"
    else:
        status, line = 4, f"{run_dir}: its logs could not be written (File too large); no checkpoint of this run"
        line += " exists yet: the run cannot be resumed"
    assert (proc.returncode, proc.stderr.strip().splitlines()) == (status, [f"{name}.py: error: {line}"]), proc.stderr


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_full_disk_at_the_final_model_write_is_one_line(name, tmp_path):
    """The checkpoint test's file-size limit, here below the model's size (the event files of a smoke run stay far
    below 200,000 bytes; the IMPALA network's weights do not): one line, no partial model, the logs kept. The full
    files, asked for a checkpoint after every iteration too, write none: each warning says that no checkpoint exists,
    and the run ends with exit status 4, its last line saying that it cannot be resumed. (The lean files write the
    model as CleanRL's do: a full disk there is torch.save's traceback.)"""
    flags = [*smoke_args(name), "--device", "cpu", "--save-model", "--exp-name", "x", "--checkpoint-interval", "1"]
    proc = subprocess.run([*python(), str(ROOT / f"{name}.py"), *flags], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, preexec_fn=file_size_limit(200_000))  # fmt: skip
    run_dir = only_run_dir(tmp_path)
    model = f"runs/{run_dir.name}/x.cleanrl_model"
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    model_line = f"{name}.py: error: {model} not written: File too large; the logs beside it are kept"
    assert lines[-2] == model_line
    assert not (tmp_path / model).exists()
    assert len(read_scalars(run_dir)["losses/policy_loss"]) == 2
    last = f"runs/{run_dir.name}/checkpoints/iter_00000002.pt"
    warnings = [line for line in lines if "warning:" in line]
    assert warnings == [
        f"{name}.py: warning: runs/{run_dir.name}/checkpoints/iter_0000000{i}.pt not written: File too large; "
        "no checkpoint of this run exists yet"
        for i in ((2,) if "ppg" in name else (1, 2))  # PPG's at the end of its one phase
    ]
    assert lines[-1] == (
        f"{name}.py: error: the run ended without its last checkpoint, {last}; no checkpoint of this run exists "
        "yet: the run cannot be resumed"
    )
    assert not list(run_dir.glob("checkpoints/*"))


def test_a_video_that_a_full_disk_refuses_is_a_warning_and_the_run_goes_on(tmp_path):
    """ffmpeg itself under a file-size limit of 2 KB (the first video is larger): its error is one warning naming the
    file, no partial video stays, and the run ends as it would have (both full files write with plumbing.write_video).
    imageio_ffmpeg's writer took such a write for done: a truncated file, said to be written."""
    with warnings.catch_warnings(action="ignore"):  # gym3's pinned imageio_ffmpeg: pkg_resources is deprecated
        import imageio_ffmpeg

    limited = tmp_path / "ffmpeg"
    limited.write_text(f'#!/bin/bash\nulimit -f 2\nexec {shlex.quote(imageio_ffmpeg.get_ffmpeg_exe())} "$@"\n')
    limited.chmod(0o755)
    flags = [*smoke_args("ppo_procgen_full"), "--total-timesteps", "512", "--device", "cpu", "--capture-video"]
    env = {**os.environ, "IMAGEIO_FFMPEG_EXE": str(limited)}  # the ffmpeg that imageio_ffmpeg names
    command = [*python(), str(ROOT / "ppo_procgen_full.py"), *flags]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    videos, lines = f"videos/{only_run_dir(tmp_path).name}", proc.stderr.splitlines()
    said = [f"ppo_procgen_full.py: warning: {videos}/episode-{i}.mp4 not written: " for i in (0, 1)]  # episodes 0, 1
    assert proc.returncode == 0 and 1 <= len(lines) <= 2, proc.stderr[-2000:]
    # ffmpeg's own words differ between its versions (4.1, below Python 3.13: "Error writing trailer of ...: File too
    # large"); the system's reason is in them
    assert all(
        line.startswith(start) and "File too large" in line
        for line, start in zip(lines, said[: len(lines)], strict=True)
    ), lines
    assert "video:" not in proc.stdout and not list((tmp_path / "videos").rglob("*.mp4"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_capture_video_where_no_ffmpeg_runs_is_one_line(name, tmp_path, monkeypatch, capsys):
    """--capture-video where no ffmpeg runs (IMAGEIO_FFMPEG_EXE names a file that is not there, as where the binary is
    missing): refused before the run in one line naming the flag and why, status 2 (it was a traceback at the first
    video); and where ffmpeg goes away during a run, a video is one warning, and the run goes on."""
    script, missing = load_script(name), tmp_path / "ffmpeg"
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(missing))
    why = f"[Errno 2] No such file or directory: '{missing}'"
    status, lines = check(script, ["--capture-video"])
    said = f"{name}.py: error: --capture-video: writes its videos with ffmpeg, which does not run here: {why}"
    assert status == 2 and lines == [said]
    script.plumbing.write_video(str(tmp_path / "episode-0.mp4"), [np.zeros((64, 64, 3), np.uint8)] * 2)
    warned = capsys.readouterr().err.splitlines()
    assert warned == [f"{name}.py: warning: {tmp_path / 'episode-0.mp4'} not written: {why}"]


@pytest.mark.parametrize("name", ["ppo_procgen_full", "ppg_procgen_full"])
def test_a_run_directory_removed_mid_run_stops_in_one_line(name, tmp_path):
    """The run directory removed after the first iteration (a clean-up script, a mistaken `rm -rf`): the next write
    stops the run with one line naming the directory, exit status 5, no traceback (TensorBoard's writer thread, which
    meets the loss first, prints none), and nothing made again. (A checkpoint's write: the checkpoint test's.)"""
    flags = [*smoke_args(name), "--device", "cpu", "--total-timesteps", str(128 * 6)]
    flags += ["--n-iteration", "6"] if "ppg" in name else []
    proc = subprocess.Popen([*python(), str(ROOT / f"{name}.py"), *flags], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    for line in proc.stdout:
        if line.startswith("iter 1/6"):
            break
    run_dir = only_run_dir(tmp_path)
    shutil.rmtree(run_dir)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 5 and err.strip().splitlines() == [
        f"{name}.py: error: runs/{run_dir.name} was removed while the run went on, and its logs and checkpoints with "
        "it; stopped, nothing made again"
    ], err[-3000:]
    assert "iter 6/6" not in out and list((tmp_path / "runs").iterdir()) == []


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_full_file_copied_without_the_plumbing_is_one_line(name, tmp_path):
    """A full file imports plumbing.py from its folder: copied alone, it says so in one line, exit status 1."""
    shutil.copy(ROOT / f"{name}.py", tmp_path)
    cmd, env = [sys.executable, f"{name}.py", "--help"], {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1 and proc.stdout == "", (proc.stdout[-300:], proc.stderr[-300:])
    said = f"{name}.py: error: plumbing.py is not beside it: copy the two together"
    assert proc.stderr.strip().splitlines() == [said]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_python_without_a_procgen_package_is_one_line(name, tmp_path):
    """No procgen package is built for Python 3.14 (or 3.9): the version is checked before any package is imported.
    The script is run as `python script.py --help` by a Python that says it is 3.14."""
    code = (
        f"import runpy, sys; sys.version_info = (3, 14, 0, 'final', 0); sys.version = '3.14.0'; "
        f"sys.path.insert(0, {str(ROOT)!r}); "  # as `python SCRIPT` puts its directory first
        f"sys.argv = [{name!r}, '--help']; runpy.run_path({str(ROOT / f'{name}.py')!r}, run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == "", (proc.stdout[-300:], proc.stderr[-300:])
    assert proc.stderr.strip().splitlines() == [
        f"{name}.py: error: Python 3.14.0 has no procgen package: use Python 3.10 to 3.13"
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_an_iteration_is_on_disk_when_it_is_reported(name, tmp_path, monkeypatch):
    """What a Ctrl-C or a kill after an iteration's console line keeps: that iteration's log is already on disk. The
    TensorBoard writer's thread is slowed down, as on a busy machine, so that nothing reaches the disk by chance."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    write = RecordWriter.write
    monkeypatch.setattr(RecordWriter, "write", lambda self, data: time.sleep(0.02) or write(self, data))
    script = load_script(name)
    monkeypatch.chdir(tmp_path)
    on_disk = []  # at each iteration's console line: the iterations whose last tag is in the event file
    monkeypatch.setattr(script.plumbing, "console", lambda text: text.startswith("iter ") and on_disk.append(
        len(read_scalars(only_run_dir(tmp_path)).get("charts/SPS", []))))  # fmt: skip
    script.train(parse(script, [*smoke_args(name), "--device", "cpu"]))
    assert on_disk == [1, 2]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_run_started_with_its_standard_output_closed_trains_silently(name, tmp_path):
    """`>&-`, as some schedulers start jobs: Python's `sys.stdout` is None. The run trains, exit status 0, nothing on
    standard error, its losses logged."""
    import os

    cmd = [*python(), str(ROOT / f"{name}.py"), *smoke_args(name), "--device", "cpu"]
    proc = subprocess.run(
        cmd, cwd=tmp_path, stderr=subprocess.PIPE, text=True, timeout=300, preexec_fn=lambda: os.close(1)
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert read_scalars(only_run_dir(tmp_path))["losses/value_loss"]
