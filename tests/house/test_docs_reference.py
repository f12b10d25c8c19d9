"""The generated reference under docs/reference/ matches the code it describes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_reference_is_current() -> None:
    done = subprocess.run(
        [sys.executable, "dev/tools/gen_reference.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (
        "docs/reference is stale: run `python dev/tools/gen_reference.py` and commit the result\n"
        + done.stdout
        + done.stderr
    )
