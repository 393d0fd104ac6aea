"""Shrink a packed procgen for the campaign's games, and prove that those games see the same frames.

What travels to a lent GPU machine is limited (64 MiB), and the procgen package that has to travel with the runs'
state is most of it: 36 MB packed, 17 MB of which are the platform and top-down games' background pictures. procgen
loads every picture when its first env starts and stops if one is missing, so the pictures no named game draws are
replaced by a 1x1 one, not removed. Which game draws which backgrounds is read from procgen's sources
(`src/resources.cpp`, each `src/games/*.cpp`'s `main_bg_images_ptr`): starpilot, bossfight and caveflyer the space
backgrounds, bigfish and plunder the water ones, the platform games the platform backgrounds (and the space ones,
which procgen adds to them), the top-down games the top-down ones.

The slimmed package is checked before it replaces the original: each named game, stepped with the same seeded
actions from both packages, must give the same frames, bit for bit, and a game that draws a replaced picture must
not (else the check could not fail). A file beside the package (`SLIM_GAMES`) names the games; the campaign refuses
any other game with such a package.

    python benchmarks/slim_procgen.py .whl/procgen2.tar.xz --games starpilot bossfight bigfish caveflyer
"""

import argparse
import hashlib
import io
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import zlib
from importlib.util import find_spec
from pathlib import Path

ASSETS = "procgen/data/assets/"
SLIM_MARK = "procgen/SLIM_GAMES"
# the background folders each game's frames are drawn from (procgen's sources, above)
SPACE, WATER, TOPDOWN = ["space_backgrounds"], ["water_backgrounds"], ["topdown_backgrounds"]
PLATFORM = ["platform_backgrounds", "platform_backgrounds_2", "space_backgrounds"]
BACKGROUNDS = {
    **dict.fromkeys(["starpilot", "bossfight", "caveflyer"], SPACE),
    **dict.fromkeys(["bigfish", "plunder"], WATER),
    **dict.fromkeys(["climber", "coinrun", "jumper", "miner", "ninja"], PLATFORM),
    **dict.fromkeys(["chaser", "dodgeball", "fruitbot", "heist", "leaper", "maze"], TOPDOWN),
}
# stepped in a subprocess with the package's folder first on the path: same levels, same seeded actions
FRAMES = """
import hashlib, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import procgen
assert procgen.__file__.startswith(sys.argv[1]), procgen.__file__
env = procgen.ProcgenGym3Env(num=4, env_name=sys.argv[2], num_levels=200, start_level=0, distribution_mode="easy",
                             rand_seed=1)
actions, digest = np.random.default_rng(0), hashlib.sha256()
for _ in range(int(sys.argv[3])):
    env.act(actions.integers(0, 15, 4).astype(np.int32))
    digest.update(env.observe()[1]["rgb"].tobytes())
print(digest.hexdigest())
"""


def tiny_png():
    """A 1x1 black RGB picture: what procgen loads in place of a background no named game draws."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # width, height, 8 bits, RGB, no interlace
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 4)) + chunk(b"IEND", b"")
    )


def replaced_folders(games):
    """The background folders none of `games` draws."""
    unknown = sorted(set(games) - BACKGROUNDS.keys())
    if unknown:
        raise SystemExit(f"--games: {unknown} not procgen games; they are {sorted(BACKGROUNDS)}")
    kept = {folder for game in games for folder in BACKGROUNDS[game]}
    return sorted({folder for folders in BACKGROUNDS.values() for folder in folders} - kept)


def slim(src, dst, games):
    """`src` packed again as `dst` (the compression its name says), the replaced folders' pictures 1x1, the games
    named in SLIM_MARK. Returns how many pictures were replaced."""
    folders = tuple(ASSETS + folder + "/" for folder in replaced_folders(games))
    png, replaced = tiny_png(), 0
    mode = "w:xz" if dst.name.endswith(".xz") else "w"
    with tarfile.open(src) as old, tarfile.open(dst, mode) as new:
        for member in old:
            data = old.extractfile(member).read() if member.isfile() else None
            if data is not None and member.name.startswith(folders) and member.name.endswith(".png"):
                data, replaced = png, replaced + 1
                member.size = len(data)
            new.addfile(member, io.BytesIO(data) if data is not None else None)
        mark = tarfile.TarInfo(SLIM_MARK)
        text = (" ".join(sorted(games)) + "\n").encode()
        mark.size = len(text)
        new.addfile(mark, io.BytesIO(text))
    return replaced


def frames(root, game, steps):
    """The digest of `game`'s frames stepped from the package unpacked at `root`."""
    env = {**os.environ, "PYTHONPATH": ""}  # the unpacked package, not one installed on the path
    out = subprocess.run(
        [sys.executable, "-c", FRAMES, str(root), game, str(steps)], capture_output=True, text=True, env=env
    )
    if out.returncode:
        raise SystemExit(f"slim_procgen: {game} did not step from {root}:\n{out.stderr[-2000:]}")
    return out.stdout.split()[-1]


def check(src, dst, games, steps):
    """Each of `games` the same frames from both packages; a game drawing a replaced folder different ones."""
    replaced = set(replaced_folders(games))
    control = next((g for g in sorted(BACKGROUNDS) if set(BACKGROUNDS[g]) <= replaced), None)
    with tempfile.TemporaryDirectory() as tmp:
        roots = [Path(tmp, "full"), Path(tmp, "slim")]
        for pack, root in zip([src, dst], roots, strict=True):
            with tarfile.open(pack) as t:
                t.extractall(root, filter="tar")
        for game in games:
            full, slimmed = (frames(root, game, steps) for root in roots)
            if full != slimmed:
                raise SystemExit(f"slim_procgen: {game}'s frames differ in the slimmed package: it is not kept")
            print(f"slim_procgen: {game}: the same frames over {steps} steps of 4 envs ({full[:12]})", flush=True)
        if control:  # the check can fail: the replaced pictures are drawn where a game uses them
            if frames(roots[0], control, steps) == frames(roots[1], control, steps):
                raise SystemExit(f"slim_procgen: {control} draws a replaced folder and its frames did not change")
            print(f"slim_procgen: {control} (not kept): its frames changed, as they must", flush=True)


def slim_games(package=None):
    """The games a procgen package (by default the one on the path) is slimmed for, or None where it has all its
    pictures."""
    spec = find_spec("procgen") if package is None else None
    package = Path(spec.origin).parent if spec and spec.origin else package
    mark = package / Path(SLIM_MARK).name if package else None
    return mark.read_text().split() if mark and mark.exists() else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pack", type=Path, help="a packed procgen (its top folders procgen/ and its libraries')")
    parser.add_argument("--games", nargs="+", required=True, help="the games whose frames must stay the same")
    parser.add_argument("--steps", type=int, default=1000, help="how many steps of 4 envs each game is checked")
    opts = parser.parse_args(argv)
    if not opts.pack.is_file():
        raise SystemExit(f"pack: {opts.pack} is not a file")
    replaced_folders(opts.games)  # the games' names checked before the package is read
    with tarfile.open(opts.pack) as t:
        mark = t.extractfile(SLIM_MARK).read().decode().split() if SLIM_MARK in t.getnames() else None
    if mark is not None and set(opts.games) <= set(mark):
        return print(f"slim_procgen: {opts.pack} is slimmed already, for {' '.join(mark)}")
    if mark is not None:  # its replaced pictures are gone: only the full package can be slimmed for other games
        raise SystemExit(f"pack: {opts.pack} is slimmed for {' '.join(mark)}: gather the full package again")
    dst = opts.pack.with_name("slim-" + opts.pack.name)
    try:
        count = slim(opts.pack, dst, opts.games)
        check(opts.pack, dst, opts.games, opts.steps)
    except BaseException:
        dst.unlink(missing_ok=True)
        raise
    before = opts.pack.stat().st_size
    os.replace(dst, opts.pack)
    digest = hashlib.sha256(opts.pack.read_bytes()).hexdigest()[:12]
    print(
        f"slim_procgen: {count} pictures replaced, {opts.pack} {before / 2**20:.1f} -> "
        f"{opts.pack.stat().st_size / 2**20:.1f} MiB ({digest}), for {' '.join(sorted(opts.games))}"
    )


if __name__ == "__main__":
    main()
