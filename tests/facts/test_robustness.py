"""Hosts nobody has seen: every attribute garbled, truncated or missing must
give a report, never a traceback (fixed seeds, so failures reproduce)."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from gpuprov.facts.host import gather
from gpuprov.facts.sysfs import Sysfs
from gpuprov.report.inspect import build_report
from gpuprov.rules.assess import assess

GARBAGE = [b"", b"\n", b"\x00\xff\xfe", b"Unknown\n", b"-1\n", b"0xZZZZ\n", b"99999999999999999999\n", b"a:b:c\n"]


def files_below(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("name", ["gpu-audio", "nvme-swap", "mtty-mdev", "h100-passthrough-guest", "boot-vga"])
@pytest.mark.parametrize("seed", range(3))
def test_garbled_attributes_never_raise(name: str, seed: int, host_root, tmp_path) -> None:
    root = tmp_path / name
    shutil.copytree(host_root(name), root, symlinks=True)
    rng = random.Random(seed)
    for path in files_below(root):
        roll = rng.random()
        if roll < 0.3:
            path.write_bytes(rng.choice(GARBAGE))
        elif roll < 0.4:
            path.unlink()
        elif roll < 0.45:
            path.chmod(0)  # unreadable (as a non-root user would find some files)
    facts = gather(Sysfs(str(root)))
    report = build_report(facts, assess(facts, extra=list(facts.pci)))
    assert report["schema"] == "gpuprov.inspect/v1"


def test_dangling_and_looping_links_never_raise(host_root, tmp_path) -> None:
    root = tmp_path / "h"
    shutil.copytree(host_root("gpu-alone"), root, symlinks=True)
    for link in [p for p in root.rglob("*") if p.is_symlink()][::3]:
        link.unlink()
        os.symlink(link.name, link)  # points at itself
    facts = gather(Sysfs(str(root)))
    assert build_report(facts, assess(facts))["schema_version"] == 1
