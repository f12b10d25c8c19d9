"""Byte-for-byte: does this tree's ``gpuprov inspect`` say what another tree's said, on every capture?

A change that only makes inspect faster must not change its report. This runs both trees'
``python -m gpuprov inspect`` on each test capture (tests/fixtures/hosts/*.tar.gz) and on the
bench's synthetic hosts (``synth_host.py``), as JSON and as the ``--all`` table, with openat2
and without it (``GPUPROV_NO_OPENAT2=1``: the walk), and compares stdout, stderr and the exit
code of each pair. Exit 1 on any difference.

    git archive HEAD gpuprov | tar -x -C /tmp/before       # the tree to compare against
    python dev/bench/inspect_compare.py /tmp/before         # captures + synthetic hosts at 0.25 and 1
    python dev/bench/inspect_compare.py /tmp/before --scales ""   # captures only
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parents[1]
sys.path.insert(0, str(BENCH))

from synth_host import make_host_root  # noqa: E402

# (label, inspect's options, extra environment)
MODES: tuple[tuple[str, tuple[str, ...], dict[str, str]], ...] = (
    ("json", ("--json",), {}),
    ("json walk", ("--json",), {"GPUPROV_NO_OPENAT2": "1"}),
    ("table --all", ("--all",), {}),
)


def _run(tree: Path, root: str, options: tuple[str, ...], extra: dict[str, str]) -> tuple[int, bytes, bytes]:
    env = {**os.environ, **extra, "PYTHONPATH": str(tree), "LC_ALL": "C", "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "gpuprov", "inspect", *options, "--root", root]
    proc = subprocess.run(cmd, env=env, capture_output=True, check=False, cwd=tree)
    return proc.returncode, proc.stdout, proc.stderr


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path, help="a directory holding the other tree's gpuprov/ package")
    p.add_argument("--scales", default="0.25,1", help="synthetic host sizes (synth_host.py --scale); '' for none")
    a = p.parse_args(argv)
    if not (a.before / "gpuprov").is_dir():
        p.error(f"{a.before} holds no gpuprov/ package")
    roots = sorted(str(c) for c in (REPO / "tests/fixtures/hosts").glob("*.tar.gz"))
    differ = 0
    with tempfile.TemporaryDirectory(prefix="gpuprov-compare-") as tmp:
        for scale in (float(s) for s in a.scales.split(",") if s):
            root = Path(tmp) / f"host-{scale:g}"
            make_host_root(root, scale=scale)
            roots.append(str(root))
        for root in roots:
            for label, options, extra in MODES:
                before = _run(a.before, root, options, extra)
                after = _run(REPO, root, options, extra)
                same = before == after
                differ += not same
                size = len(after[1])
                print(f"{'same' if same else 'DIFFERS':7} {label:12} rc {after[0]} {size:>9} B  {Path(root).name}")
    print(f"{differ} difference(s)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
