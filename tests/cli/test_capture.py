"""gpuprov capture: what inspect reads, read back identically, nothing private."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpuprov.cli import rootfs
from gpuprov.cli.capture import capture
from gpuprov.cli.main import main
from tests.conftest import captured_hosts, tree_digest

_ADDRESS = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b|\b[0-9a-f]{4}(?::[0-9a-f]{4}){7}\b")


def inspect(root: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    """The report, less what a capture rewrites on purpose (docs/concepts/capture-privacy.md):
    the kernel arguments it drops and the numbers of IP addresses (which NIC has one stays)."""
    assert main(["inspect", "--json", "--root", str(root)]) == 0
    report = json.loads(capsys.readouterr().out)
    report["host"].pop("root")
    report["iommu"].pop("cmdline")
    return json.loads(_ADDRESS.sub("<ip>", json.dumps(report)))


def unpack(tarball: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    rootfs.unpack(str(tarball), str(dest))
    return dest


@pytest.mark.parametrize("name", captured_hosts())
def test_capture_of_a_capture_reads_back_the_same(name, host_root, tmp_path, capsys) -> None:
    root = host_root(name)
    before = tree_digest(root)
    out = tmp_path / "again.tar.gz"
    assert main(["capture", str(out), "--root", str(root)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}: ")
    assert tree_digest(root) == before  # capture only reads
    assert inspect(unpack(out, tmp_path / "x"), capsys) == inspect(root, capsys)


def test_live_capture_reads_back_as_the_live_host(tmp_path, capsys) -> None:
    out = tmp_path / "live.tar.gz"
    assert main(["capture", str(out)]) == 0
    capsys.readouterr()
    live = inspect(Path("/"), capsys)
    captured = inspect(unpack(out, tmp_path / "x"), capsys)
    # The in-use scan is the one live-only part: a capture holds only what it found.
    for report in (live, captured):
        report["host_needs"].pop("open_files_complete")
        needs = report["host_needs"]
        needs["missing_evidence"] = [m for m in needs["missing_evidence"] if m["rule"] != "in-use"]
    assert captured == live


@pytest.mark.skipif(shutil.which("lspci") is None, reason="pciutils not installed (scripts/test.sh installs it)")
def test_lspci_reads_a_capture(host_root, tmp_path) -> None:
    out = tmp_path / "c.tar.gz"
    capture(str(out), str(host_root("gpu-audio")))
    root = unpack(out, tmp_path / "x")
    listing = subprocess.run(
        ["lspci", "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci", "-nnk"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "01:00.0 Unclassified device [00ff]" in listing and "[1234:11e8]" in listing
    assert "Kernel driver in use: snd_hda_intel" in listing


def test_links_are_relative_and_serials_absent(fake, tmp_path) -> None:
    fake.pci("0000:41:00.0", cls=0x030000, driver="vfio-pci", group=5)
    base = fake.root / fake.paths["0000:41:00.0"]
    (base / "serial_number").write_text("12-34-56-78-9a-bc-de-f0\n")
    (base / "vpd").write_bytes(b"\x82SERIAL-IN-VPD")
    # config space with a Device Serial Number extended capability at 0x100
    config = bytearray(4096)
    config[0x100:0x104] = (0x0003 | (1 << 16)).to_bytes(4, "little")
    config[0x104:0x10C] = bytes(range(1, 9))
    (base / "config").write_bytes(bytes(config))
    fake.open_file(4242, "qemu-system-x86", "/dev/vfio/5", fd=7)
    os.symlink("socket:[12345]", fake.root / "proc/4242/fd/8")
    os.symlink("/home/alice/secret.txt", fake.root / "proc/4242/fd/9")
    fake.open_file(99, "bash", "/dev/pts/0")
    out = tmp_path / "c.tar.gz"
    capture(str(out), str(fake.finish()))
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
        cfg = tar.extractfile(members[f"{fake.paths['0000:41:00.0']}/config"]).read()
    links = {n: m.linkname for n, m in members.items() if m.issym()}
    assert links["proc/4242/fd/7"] == "/dev/vfio/5"
    assert "proc/4242/fd/8" not in members and "proc/4242/fd/9" not in members
    assert not any(n.startswith("proc/99") for n in members)
    others = {n: t for n, t in links.items() if not n.startswith("proc/")}
    assert others and all(not t.startswith("/") for t in others.values())
    assert not any(n.endswith(("/serial_number", "/vpd")) for n in members)
    assert cfg[0x104:0x10C] == bytes(8) and cfg[0x100] == 3


def test_the_installed_packages_are_captured_without_what_names_anyone(fake, tmp_path) -> None:
    """Issue 25: scripts/offline-debs.sh --capture fills an offline directory for the captured host from
    its dpkg status: names, versions and relations kept; descriptions, maintainers and conffiles left out."""
    fake.write(
        "var/lib/dpkg/status",
        "Package: libc6\nStatus: install ok installed\nMaintainer: Alice <alice@example.org>\n"
        "Architecture: amd64\nMulti-Arch: same\nVersion: 2.39-0ubuntu8\nDepends: libgcc-s1\n"
        "Conffiles:\n /etc/ld.so.conf.d/x86_64-linux-gnu.conf 593ad12389ab2b6f952e7ede67b8fbbf\n"
        "Description: GNU C Library: Shared libraries\n Contains the standard libraries.\n\n"
        "Package: mawk\nStatus: install ok installed\nVersion: 1.3.4\nProvides: awk\n",
    )
    out = tmp_path / "c.tar.gz"
    capture(str(out), str(fake.finish()))
    with tarfile.open(out) as tar:
        status = tar.extractfile("var/lib/dpkg/status").read().decode()
    assert status == (
        "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nMulti-Arch: same\n"
        "Version: 2.39-0ubuntu8\nDepends: libgcc-s1\n\n"
        "Package: mawk\nStatus: install ok installed\nVersion: 1.3.4\nProvides: awk\n"
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [("out.zip", "should end in .tar.gz"), ("missing/dir/out.tar.gz", "does not exist")],
)
def test_bad_output_is_refused_and_nothing_is_written(name, message, host_root, tmp_path, capsys) -> None:
    before = tree_digest(tmp_path)
    assert main(["capture", str(tmp_path / name), "--root", str(host_root("ci-host-no-iommu"))]) == 2
    assert message in capsys.readouterr().err
    assert tree_digest(tmp_path) == before
