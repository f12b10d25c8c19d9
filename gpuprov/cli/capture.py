"""``gpuprov capture``: the parts of a host's sysfs/procfs that inspect reads,
as a tarball that ``gpuprov inspect --root`` (and ``lspci -A linux-sysfs``)
reads back. What a user attaches to a bug report.

The file list is not kept by hand: facts are gathered once with a tracing
reader and every file, directory and symlink it touched is copied, so the
capture cannot drift from what inspect reads. Symlinks inside sysfs are stored
relative. What identifies the machine or its users is left out or rewritten
(gpuprov/privacy.py, docs/concepts/capture-privacy.md).
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
from collections.abc import Callable

from .. import __version__
from ..facts.boot import gather as gather_boot
from ..facts.host import gather
from ..facts.packages import DPKG_STATUS
from ..facts.pci import PCI_ADDRESS_RE
from ..facts.sysfs import Sysfs
from ..facts.usage import _DEV_FILES, guest_digest
from .privacy import PRIVATE_NAMES, lspci_verbose, scrub_members, smi_xml, zero_dsn, zero_ids

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
# Under a process that holds a GPU/DRM/VFIO file: its name and those fds, nothing else.
_PID_FILES = re.compile(r"^proc/\d+(/comm|/fd|/fd/\d+)?$")
# Each command's output, and what is kept of it (no hostname: uname without -n).
_COMMANDS: dict[str, tuple[list[str], Callable[[str], str | None]]] = {
    "lspci-nnk": (["lspci", "-D", "-nnk"], zero_ids),
    "lspci-vvv": (["lspci", "-D", "-nn", "-vvv"], lspci_verbose),
    "nvidia-smi-q-x": (["nvidia-smi", "-q", "-x"], smi_xml),
    "uname": (["uname", "-s", "-r", "-v", "-m"], zero_ids),
}


class CaptureError(RuntimeError):
    pass


class _Archive:
    """Members by path, added once, in the order met."""

    def __init__(self, sysfs: Sysfs, allowed_pids: set[str]) -> None:
        self.sysfs = sysfs
        self.allowed_pids = allowed_pids
        self.members: dict[str, tuple[str, bytes | str | None]] = {}

    def _allowed(self, rel: str) -> bool:
        m = _PROC_PID.match(rel)
        if m:
            if m.group(1) not in self.allowed_pids or not _PID_FILES.match(rel):
                return False
            if "/fd/" in rel:  # only the GPU/DRM/VFIO files, not sockets or paths
                target = self.sysfs.readlink(rel)
                return bool(target and target.startswith(_DEV_FILES))
        return rel.rsplit("/", 1)[-1] not in PRIVATE_NAMES

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
                    data = zero_dsn(data)
                elif real.startswith("proc/driver/"):
                    data = zero_ids(data.decode("utf-8", "replace")).encode()  # GPU UUIDs
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


def _command_outputs(archive: _Archive) -> None:
    for name, (argv, keep) in _COMMANDS.items():
        if shutil.which(argv[0]) is None:
            continue
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        kept = keep(result.stdout) if result.returncode == 0 else None
        if kept is not None:
            archive.add_bytes(f"capture/{name}", kept.encode())


def capture(out: str, root: str = "/", *, run_commands: bool = True, _commands_on_any_root: bool = False) -> int:
    """Write the capture of ``root`` to ``out`` (a .tar.gz); returns the member count.

    Commands (lspci, nvidia-smi, uname) describe this machine, so they run only when
    ``root`` is ``/``; ``_commands_on_any_root`` is for tests that put fake ones on PATH.
    """
    if not out.endswith((".tar.gz", ".tgz")):
        raise CaptureError(f"'{out}' should end in .tar.gz: the capture is a gzip tarball")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise CaptureError(f"directory '{parent}' does not exist: create it or write the capture elsewhere")
    sysfs = Sysfs(root, trace=True)
    facts = gather(sysfs)
    # The kernel arguments configured (GRUB's defaults and drop-ins, /etc/kernel/cmdline), scrubbed as
    # /proc/cmdline is: the playbook's dry run and the fleet's drift read them from a capture too.
    gather_boot(sysfs, bootloader="grub")  # files only: no grubby run for what a capture keeps
    pids = {str(f.pid) for f in facts.usage.open_files}
    archive = _Archive(Sysfs(root), pids)
    for op, rel in sysfs.trace or []:
        archive.add_path(rel, listing=op == "listdir")
    # Which VM a holder's QEMU runs (its -name guest=, or libvirt's pid file), as a digest of the name and
    # nothing else of its command line: a capture plans a running VM's GPU as the live host does.
    for held in facts.usage.open_files:
        if held.guest is not None:
            argv = f"{held.command or 'qemu'}\0-name\0guest={guest_digest(held.guest)}\0"
            archive.add_bytes(f"proc/{held.pid}/cmdline", argv.encode("utf-8", "surrogateescape"))
    for address, dev in facts.pci.items():
        for name in _LSPCI_FILES:
            archive.add_path(f"{dev.sysfs_path}/{name}")
        archive.add_path(f"sys/bus/pci/devices/{address}")
        if dev.driver:
            archive.add_path(f"sys/bus/pci/drivers/{dev.driver}")
    # The installed packages (fields that name no one: gpuprov.cli.privacy.dpkg_status), so an offline
    # directory can be filled for this very host (scripts/offline-debs.sh --capture).
    archive.add_path(DPKG_STATUS)
    if run_commands and (sysfs.live or _commands_on_any_root):
        _command_outputs(archive)
    archive.members = scrub_members(archive.members, set(facts.usage.block))
    # Not the root's path: a directory name can hold a user's or a host's name.
    meta = {
        "gpuprov_version": __version__,
        "captured_at": int(time.time()),
        "live": sysfs.live,
        "privacy": "identifying values left out or rewritten: docs/concepts/capture-privacy.md",
    }
    archive.add_bytes("capture/gpuprov-capture.json", json.dumps(meta, indent=1).encode())
    return archive.write(out)
