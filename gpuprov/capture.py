"""``gpuprov capture``: the parts of a host's sysfs/procfs that inspect reads,
as a tarball that ``gpuprov inspect --root`` (and ``lspci -A linux-sysfs``)
reads back. What a user attaches to a bug report.

The file list is not kept by hand: facts are gathered once with a tracing
reader and every file, directory and symlink it touched is copied, so the
capture cannot drift from what inspect reads. Symlinks inside sysfs are stored
relative; serial numbers are left out or zeroed.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import time

from . import __version__
from .host.facts import gather
from .host.pci import PCI_ADDRESS_RE
from .host.sysfs import Sysfs
from .host.usage import _DEV_FILES

# Never copied: serial numbers and identifiers (vpd holds the board serial).
_PRIVATE_NAMES = {"serial_number", "serial", "vpd", "wwid", "address", "uuid", "phys_port_id"}
# Extra per-device files so lspci -A linux-sysfs can read the capture too
# (inspect itself takes the ids from uevent).
_LSPCI_FILES = (
    "config",
    "resource",
    "irq",
    "modalias",
    "vendor",
    "device",
    "subsystem_vendor",
    "subsystem_device",
    "class",
    "revision",
    "label",
)
_PROC_PID = re.compile(r"^proc/(\d+)(/|$)")
_COMMANDS = {
    "lspci-nnk": ["lspci", "-D", "-nnk"],
    "lspci-vvv": ["lspci", "-D", "-nn", "-vvv"],
    "nvidia-smi-q-x": ["nvidia-smi", "-q", "-x"],
    "uname": ["uname", "-a"],
}
_SCRUB = (
    (re.compile(r"(Device Serial Number) [0-9a-f-]+"), r"\1 00-00-00-00-00-00-00-00"),
    (re.compile(r"<serial>[^<]*</serial>"), "<serial>0000000000000</serial>"),
    (re.compile(r"GPU-[0-9a-fA-F-]{36}"), "GPU-00000000-0000-0000-0000-000000000000"),
    (re.compile(r"MIG-[0-9a-fA-F-]{36}"), "MIG-00000000-0000-0000-0000-000000000000"),
)


class CaptureError(RuntimeError):
    pass


def _zero_dsn(config: bytes) -> bytes:
    """Zero the Device Serial Number extended capability (id 0x0003) in config space."""
    data = bytearray(config)
    pos, hops = 0x100, 0
    while 0x100 <= pos <= len(data) - 12 and hops < 64:
        header = int.from_bytes(data[pos : pos + 4], "little")
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == 0x0003:
            data[pos + 4 : pos + 12] = bytes(8)
        pos, hops = (header >> 20) & 0xFFC, hops + 1
    return bytes(data)


class _Archive:
    """Members by path, added once, in the order met."""

    def __init__(self, sysfs: Sysfs, allowed_pids: set[str]) -> None:
        self.sysfs = sysfs
        self.allowed_pids = allowed_pids
        self.members: dict[str, tuple[str, bytes | str | None]] = {}

    def _allowed(self, rel: str) -> bool:
        m = _PROC_PID.match(rel)
        if m:
            if m.group(1) not in self.allowed_pids:
                return False
            if "/fd/" in rel:  # only the GPU/DRM/VFIO files, not sockets or paths
                target = self.sysfs.readlink(rel)
                return bool(target and target.startswith(_DEV_FILES))
        return rel.rsplit("/", 1)[-1] not in _PRIVATE_NAMES

    def add_path(self, rel: str, *, listing: bool = False) -> None:
        """Add ``rel`` with every symlink on the way to it, at its real place."""
        if not self._allowed(rel):
            return
        parts: list[str] = []
        pending = [p for p in rel.split("/") if p]
        hops = 0
        while pending:
            name = pending.pop(0)
            if name == "..":
                parts = parts[:-1]
                continue
            here = "/".join([*parts, name])
            full = self.sysfs.path(here)
            if os.path.islink(full) and hops < 64:
                hops += 1
                target = os.readlink(full)
                if not _PROC_PID.match(here):
                    target = self._relative(here, target)
                self.members.setdefault(here, ("link", target))
                if _PROC_PID.match(here):
                    return  # an fd's /dev target is data, not a path inside the root
                if target.startswith("/"):
                    parts, pending = [], target.strip("/").split("/") + pending
                else:
                    pending = target.split("/") + pending
                continue
            parts.append(name)
        real = "/".join(parts)
        full = self.sysfs.path(real)
        if os.path.isdir(full):
            self.members.setdefault(real, ("dir", None))
            if listing:
                for entry in self.sysfs.listdir(real):
                    child = f"{real}/{entry}"
                    cfull = self.sysfs.path(child)
                    if os.path.islink(cfull):
                        self.add_path(child)
                    elif os.path.isdir(cfull) and self._allowed(child):
                        self.members.setdefault(child, ("dir", None))
        elif os.path.isfile(full):
            data = self.sysfs.read_bytes(real)
            if data is not None:
                if real.endswith("/config") and PCI_ADDRESS_RE.match(real.rsplit("/", 2)[-2]):
                    data = _zero_dsn(data)
                elif real.startswith("proc/driver/"):
                    data = _scrub(data.decode("utf-8", "replace")).encode()  # GPU UUIDs
                self.members.setdefault(real, ("file", data))

    def _relative(self, here: str, target: str) -> str:
        if not target.startswith("/"):
            return target
        return os.path.relpath(target.lstrip("/") or ".", os.path.dirname(here) or ".")

    def add_bytes(self, rel: str, data: bytes) -> None:
        self.members[rel] = ("file", data)

    def write(self, out: str) -> int:
        now = int(time.time())
        count = 0
        with tarfile.open(out, "w:gz") as tar:
            for rel, (kind, payload) in self.members.items():
                info = tarfile.TarInfo(rel)
                info.mtime = now
                if kind == "dir":
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                elif kind == "link":
                    info.type, info.linkname = tarfile.SYMTYPE, str(payload)
                    info.mode = 0o777
                    tar.addfile(info)
                else:
                    data = payload if isinstance(payload, bytes) else b""
                    info.size, info.mode = len(data), 0o444
                    tar.addfile(info, io.BytesIO(data))
                count += 1
        return count


def _scrub(text: str) -> str:
    for pattern, repl in _SCRUB:
        text = pattern.sub(repl, text)
    return text


def _command_outputs(archive: _Archive) -> None:
    for name, argv in _COMMANDS.items():
        if shutil.which(argv[0]) is None:
            continue
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if result.returncode == 0:
            archive.add_bytes(f"capture/{name}", _scrub(result.stdout).encode())


def capture(out: str, root: str = "/", *, run_commands: bool = True) -> int:
    """Write the capture of ``root`` to ``out`` (a .tar.gz); returns the member count."""
    if not out.endswith((".tar.gz", ".tgz")):
        raise CaptureError(f"'{out}' should end in .tar.gz: the capture is a gzip tarball")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise CaptureError(f"directory '{parent}' does not exist: create it or write the capture elsewhere")
    sysfs = Sysfs(root, trace=True)
    facts = gather(sysfs)
    pids = {str(f.pid) for f in facts.usage.open_files}
    archive = _Archive(Sysfs(root), pids)
    for op, rel in sysfs.trace or []:
        archive.add_path(rel, listing=op == "listdir")
    for address, dev in facts.pci.items():
        for name in _LSPCI_FILES:
            archive.add_path(f"{dev.sysfs_path}/{name}")
        archive.add_path(f"sys/bus/pci/devices/{address}")
        if dev.driver:
            archive.add_path(f"sys/bus/pci/drivers/{dev.driver}")
    if run_commands and sysfs.live:
        _command_outputs(archive)
    meta = {"gpuprov_version": __version__, "captured_at": int(time.time()), "root": root}
    archive.add_bytes("capture/gpuprov-capture.json", json.dumps(meta, indent=1).encode())
    return archive.write(out)
