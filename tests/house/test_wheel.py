"""The pip wheel hosts install: the gpuprov package with its CLI and JSON schemas, and no lab
code (dev/lab/ is a development tool run from the checkout by scripts/main.sh)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_gpuprov_and_no_lab_code(tmp_path: Path) -> None:
    # Built from a copy: a checkout's stale build/lib (setuptools reuses it) cannot leak in,
    # and the checkout gets no build/ or egg-info. dev/lab/ is copied too: the package find
    # in pyproject.toml must leave it out.
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("gpuprov", "dev"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    out = tmp_path / "whl"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = out.glob("gpuprov-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"gpuprov", next(t for t in tops if t.endswith(".dist-info"))}, tops
    assert not [n for n in names if n.startswith("dev/") or Path(n).stem in ("lab", "debpkg")]
    assert "gpuprov/cli/main.py" in names
    assert any(n.startswith("gpuprov/schemas/") and n.endswith(".json") for n in names)
