"""Every host_vars example in the README and the guides is one `gpuprov plan` accepts as
input: it may refuse on the captured host's devices (exit 3), never call the file
malformed (exit 2). An example in the old form without VMs (a MIG layout) is planned with an
empty ``gpu_vms_list``, which plan needs to read the file as a host_vars file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A captured host with an mdev parent, so mdev entries meet real sysfs.
HOST = ROOT / "tests" / "fixtures" / "hosts" / "mtty-mdev.tar.gz"
_YAML = re.compile(r"^```yaml\n(# host_vars/.*?)^```", re.M | re.S)


def examples() -> list[tuple[str, str]]:
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]:
        for i, block in enumerate(_YAML.findall(page.read_text(encoding="utf-8"))):
            found.append((f"{page.relative_to(ROOT).as_posix()}#{i}", block))
    return found


def test_the_readme_has_its_example() -> None:
    assert any(name.startswith("README.md#") for name, _ in examples()), "README.md lost its host_vars example"


@pytest.mark.parametrize(("name", "text"), examples(), ids=[n for n, _ in examples()])
def test_example_is_valid_plan_input(name: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / "host_vars.yml"
    if not re.search(r"^(gpu_vms_list|gpuprov_host):", text, re.M):
        text += "gpu_vms_list: []\n"
    path.write_text(text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="200")
    done = subprocess.run(
        [sys.executable, "-m", "gpuprov", "plan", "--root", str(HOST), str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 3), f"{name}: gpuprov plan exited {done.returncode}\n{done.stdout}{done.stderr}"
    assert "Traceback" not in done.stderr
