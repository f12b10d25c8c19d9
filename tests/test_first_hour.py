"""The first hour (issue #50): dev/first-hour.sh walks the README's install block as written, in a fresh
home with the system's PATH, then the playbook by FQCN, inspect, init, plan of the example inventory
and a fleet dry run, from outside the checkout. Every step must pass; the walk prints each one's time."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = (
    "README install block",
    "ansible-playbook gpuprov.kvm.gpu_passthrough --syntax-check",
    "gpuprov --version",
    "gpuprov inspect (a capture)",
    "gpuprov init (a capture)",
    "gpuprov plan -i the example inventory --host gpu-node-01",
    "gpuprov plan -i the example inventory --host gpu-node-02",
    "gpuprov fleet (a staged capture)",
    "total",
)


def test_the_readme_install_block_and_the_first_commands_work_from_a_fresh_home() -> None:
    proc = subprocess.run(
        [str(REPO / "dev" / "first-hour.sh")], capture_output=True, text=True, timeout=1500, check=False
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    said = [line.split(" s  ", 1)[1] for line in proc.stdout.splitlines() if " s  " in line]
    assert [s for s in said if not s.startswith("README install block")] == list(STEPS[1:])
    assert said[0].startswith(STEPS[0])
