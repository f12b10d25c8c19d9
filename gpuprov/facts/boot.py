"""How a host boots, as far as its kernel command line goes: the running kernel's arguments,
GRUB's defaults file and drop-ins, which of GRUB's tools (update-grub, grub2-mkconfig,
grub-mkconfig) and grubby are installed under the root, and what grubby shows as the default
entry's arguments (docs/reference/kernel-cmdline.md). Read through :class:`Sysfs`; grubby's
view is a command run on the live host only. plan/host/cmdline.py decides what to change.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from .sysfs import Sysfs

GRUB_DEFAULT = "etc/default/grub"
GRUB_DROPINS = "etc/default/grub.d"
GRUBBY = ("usr/sbin/grubby", "sbin/grubby")
# Bounds on what is read (issue 26: every parser of host content bounded in time and memory):
# /proc/cmdline (the kernel's is at most 2 KiB on x86; a staged root's is any file), the drop-ins
# update-grub sources (a few on a real host), and each drop-in's text (searched for one name).
MAX_CMDLINE = 64 * 1024
MAX_DROPINS = 64
MAX_DROPIN = 256 * 1024


@dataclass
class BootFacts:
    live: bool
    proc_cmdline: str = ""
    has_grubby: bool = False
    update_argv: list[str] | None = None  # what regenerates the GRUB menu; None: no tool found
    grub_default: bytes | None = None  # /etc/default/grub's bytes (None: absent or unreadable)
    grub_default_unreadable: bool = False  # it exists but cannot be read (not root)
    dropins: dict[str, str] = field(default_factory=dict)  # /etc/default/grub.d/*.cfg, name -> text
    # (rc, stdout, stderr) of ``grubby --info=DEFAULT``; None when not asked (see :func:`gather`).
    grubby_info: tuple[int, str, str] | None = None


def grub_update_argv(sysfs: Sysfs) -> list[str] | None:
    """The command that regenerates the GRUB menu on this root, or None."""
    if sysfs.exists("usr/sbin/update-grub"):
        return ["update-grub"]
    for tool in ("grub2-mkconfig", "grub-mkconfig"):
        if sysfs.exists(f"usr/sbin/{tool}"):
            cfg = "/boot/grub2/grub.cfg" if sysfs.exists("boot/grub2") else "/boot/grub/grub.cfg"
            return [tool, "-o", cfg]
    return None


def grubby_info() -> tuple[int, str, str]:
    """``grubby --info=DEFAULT`` on the live host: (rc, stdout, stderr)."""
    try:
        r = subprocess.run(["grubby", "--info=DEFAULT"], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, "", str(exc)
    return r.returncode, r.stdout, r.stderr


def _text(raw: bytes | None) -> str:
    return "" if raw is None else raw.decode("utf-8", "replace")


def gather(sysfs: Sysfs, bootloader: str = "auto") -> BootFacts:
    """The boot facts of ``sysfs``'s root. grubby is asked (live root only) when ``bootloader``
    (kernel_cmdline's option: auto, grub, grubby) may pick it: grubby, or auto where it is installed."""
    facts = BootFacts(live=sysfs.live, proc_cmdline=(sysfs.read("proc/cmdline") or "")[:MAX_CMDLINE])
    facts.has_grubby = any(sysfs.exists(p) for p in GRUBBY)
    facts.update_argv = grub_update_argv(sysfs)
    names = [name for name in sysfs.listdir(GRUB_DROPINS) if name.endswith(".cfg")][:MAX_DROPINS]
    facts.dropins = {name: _text(sysfs.read_bytes(f"{GRUB_DROPINS}/{name}"))[:MAX_DROPIN] for name in names}
    facts.grub_default = sysfs.read_bytes(GRUB_DEFAULT)
    facts.grub_default_unreadable = facts.grub_default is None and sysfs.exists(GRUB_DEFAULT)
    if facts.live and (bootloader == "grubby" or (bootloader == "auto" and facts.has_grubby)):
        facts.grubby_info = grubby_info()
    return facts
