"""Debian packages for the emulated hosts: versions, a download cache, mtty.

Shared by ``dev/emuhost/capture-topologies.py`` (busybox + Python initramfs
hosts) and ``dev.lab`` (a bootable disk image): both are made only of
Debian packages, resolved with the build machine's own ``apt-cache`` (its
sources and pinning) and fetched with ``apt-get download`` into a cache, so a
second build downloads nothing. Never shipped to targets (uses subprocess).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO


class CommandError(RuntimeError):
    """A build command failed; the message holds the command and its stderr."""


def sh(cmd: list[str], **kw) -> str:
    """Run ``cmd``; its stdout, or CommandError with its stderr."""
    r = subprocess.run(cmd, text=True, capture_output=True, check=False, **kw)
    if r.returncode:
        raise CommandError(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr or r.stdout}")
    return r.stdout


def show(*names: str) -> dict[str, str]:
    """``apt-cache show`` of each name's candidate version, in one call (names apt does not know
    are left out)."""
    r = subprocess.run(["apt-cache", "show", "--no-all-versions", *names], text=True, capture_output=True, check=False)
    out = {}
    for stanza in r.stdout.split("\n\n"):
        m = re.search(r"^Package: (\S+)", stanza, re.M)
        if m:
            out[m.group(1)] = stanza
    return out


def _missing(name: str) -> CommandError:
    return CommandError(
        f"apt knows no package {name}: run `apt-get update` (Debian 12 sources with main) and try again"
    )


# Kernel metapackages, resolved to the image each pulls (its name carries the kernel's version).
KERNEL_METAPACKAGES = ("linux-image-amd64", "linux-image-cloud-amd64")


def resolve(names: Iterable[str]) -> dict[str, str]:
    """name -> candidate version, with each kernel metapackage (KERNEL_METAPACKAGES) replaced by the
    image it pulls."""
    names = list(names)
    info = show(*names)
    for meta in [n for n in names if n in KERNEL_METAPACKAGES]:
        m = re.search(r"^Depends:.*?(linux-image-[\w.-]+)", info.get(meta, ""), re.M)
        if not m:
            raise _missing(meta)
        image = m.group(1)
        info.update(show(image))
        names = [image if n == meta else n for n in names]
    out = {}
    for name in names:
        m = re.search(r"^Version: (\S+)", info.get(name, ""), re.M)
        if not m:
            raise _missing(name)
        out[name] = m.group(1)
    return out


def same_release(madison: str, name: str, ver: str) -> str:
    """``ver`` when ``apt-cache madison NAME`` lists it, else the first version it lists of the same
    upstream release (``ver`` without its Debian revision). A security upload can move some of one
    source's packages and not others: on 2026-11-29 bookworm-security had linux-kbuild-6.1 at
    6.1.192-3 only, beside linux-headers-6.1.0-56-amd64 at 6.1.192-2 (the tools of the same
    release build the same module)."""
    known = [parts[1].strip() for line in madison.splitlines() if len(parts := line.split("|")) >= 3]
    if ver in known:
        return ver
    upstream = ver.rsplit("-", 1)[0]
    for candidate in known:
        if candidate.rsplit("-", 1)[0] == upstream:
            return candidate
    raise CommandError(
        f"apt knows no {name} of release {upstream} (it has {', '.join(known) or 'none'}): "
        "run `apt-get update` (Debian 12 sources with main and security) and try again"
    )


def of_release(name: str, ver: str) -> str:
    """same_release() for ``name`` with the build machine's apt."""
    return same_release(sh(["apt-cache", "madison", name]), name, ver)


def download(pkgs: dict[str, str], debs: Path) -> list[Path]:
    """The .deb of each name=version, from ``debs`` or downloaded into it."""
    debs.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name, ver in pkgs.items():
        pattern = f"{name}_{ver.replace(':', '%3a')}_*.deb"  # _amd64 or _all
        if not list(debs.glob(pattern)):
            sh(["apt-get", "download", f"{name}={ver}"], cwd=debs)
        paths += debs.glob(pattern)
    return paths


def deb_members(deb: Path, *members: str) -> dict[str, bytes]:
    """Files of a .deb (``bin/busybox``), as bytes, from one unpacking."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-deb-") as tmp:
        sh(["dpkg-deb", "-x", str(deb), tmp])
        out = {}
        for member in members:
            path = Path(tmp, member)
            if not path.is_file():
                raise CommandError(f"{deb.name} has no file {member}")
            out[member] = path.read_bytes()
        return out


def deb_member(deb: Path, member: str) -> bytes:
    """One file of a .deb (``bin/busybox``), as bytes."""
    return deb_members(deb, member)[member]


# A cpio entry: (path, mode, file data or symlink target[, (rdev major, rdev minor)]).
CpioEntry = tuple[Any, ...]


def cpio(entries: Iterable[CpioEntry], out: Path | BinaryIO) -> None:
    """Write a newc cpio archive (what the kernel unpacks as an initramfs).

    Done here rather than with cpio(1) so every file is root's and device nodes
    such as /dev/console (the kernel opens it for PID 1) exist without root on the
    build machine. Paths are relative (no leading /); parents come first."""
    if isinstance(out, Path):
        with open(out, "wb") as f:
            cpio(entries, f)
        return
    ino = 1

    def put(name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        nonlocal ino
        raw = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(raw), 0)
        out.write(("070701" + "".join(f"{v:08x}" for v in fields)).encode() + raw + b"\0" * (-(110 + len(raw)) % 4))
        out.write(data + b"\0" * (-len(data) % 4))
        ino += 1

    for name, mode, data, *rdev in entries:
        put(name, mode, data.encode() if isinstance(data, str) else data, *rdev)
    put("TRAILER!!!", 0)
    out.write(b"\0" * (-out.tell() % 512))


def build_mtty(kver: str, ko: Path, debs: Path) -> Path:
    """mtty.ko (samples/vfio-mdev, not in Debian's kernel) built for ``kver`` against
    Debian's headers: an mdev parent for hosts without vGPU hardware. Cached at ``ko``."""
    if ko.exists():
        return ko
    headers = f"linux-headers-{kver}"
    ver = resolve([headers])[headers]
    info = show(headers)[headers]
    common = re.search(r"^Depends:.*?(linux-headers-[\w.-]+-common)", info, re.M).group(1)
    series = re.match(r"\d+\.\d+", ver).group(0)
    kbuild, source = f"linux-kbuild-{series}", f"linux-source-{series}"
    got = download({headers: ver, common: ver, kbuild: of_release(kbuild, ver), source: of_release(source, ver)}, debs)
    with tempfile.TemporaryDirectory(prefix="gpuprov-mtty-") as tmp:
        x, m_dir = Path(tmp, "x"), Path(tmp, "m")
        for deb in got[:3]:
            sh(["dpkg-deb", "-x", str(deb), str(x)])
        # The headers' Makefile includes the -common tree by absolute path: point it here.
        hdir = x / "usr/src" / headers
        (hdir / "Makefile").write_text(f"include {x}/usr/src/{common}/Makefile\n")
        m_dir.mkdir()
        src = f"linux-source-{series}"
        sh(
            [
                "sh",
                "-c",
                f"dpkg-deb --fsys-tarfile {got[3]} | tar -xO ./usr/src/{src}.tar.xz"
                f" | tar -xJO {src}/samples/vfio-mdev/mtty.c > {m_dir}/mtty.c",
            ]
        )
        (m_dir / "Makefile").write_text("obj-m := mtty.o\n")
        sh(["make", "-C", str(hdir), f"M={m_dir}", "modules"])
        ko.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(m_dir / "mtty.ko", ko)
    return ko


# The emulated GPU host both the lab and dev/emuhost boot: q35 with an Intel
# IOMMU (interrupt remapping needs the split irqchip), TCG (KVM hangs on these
# machines), an Intel CPU without the hypervisor bit to match the IOMMU and look
# like bare metal (TCG has no VT-x). The vCPUs and memory are each user's (the lab: two NUMA nodes).
QEMU_HOST = [
    "qemu-system-x86_64",
    "-machine",
    "q35,kernel-irqchip=split",
    "-accel",
    "tcg",
    "-cpu",
    "Nehalem,-hypervisor",
    "-device",
    "intel-iommu,intremap=on,caching-mode=on",
]
