"""A fleet of staged roots built from the captures under tests/fixtures/hosts (unpacked by the CLI's
own safe reader), some converged, some changed the ways a real host drifts or breaks: a GPU moved to
another slot, its driver unbound, an mdev gone, a GPU off the bus, errors in the kernel log. The
fleet report's tests (tests/cli/test_fleet.py) and its bench (dev/bench/fleet.py) use it.

Each change is made the way the kernel would show it below the root: a moved GPU's device folder
and its bus link renamed, an unbound driver's link and uevent line gone, a removed mdev's folder
and links gone, a dead GPU's config space all ones."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from gpuprov.cli import rootfs

REPO = Path(__file__).resolve().parents[1]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
MTTY_UUID = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
EDU = "0000:01:00.0"  # the emulated hosts' GPU stand-in (QEMU's edu, 1234:11e8)
H100 = "0000:00:06.0"


def unpack(capture: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    rootfs.unpack(str(HOSTS / f"{capture}.tar.gz"), str(dest))
    return dest


def device_dir(root: Path, address: str) -> Path:
    return (root / "sys/bus/pci/devices" / address).resolve()


def grub_as_booted(root: Path) -> None:
    """/etc/default/grub configuring exactly the arguments the capture booted with."""
    booted = (root / "proc/cmdline").read_text().strip()
    (root / "etc/default").mkdir(parents=True, exist_ok=True)
    (root / "etc/default/grub").write_text(
        f'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="{booted}"\nGRUB_CMDLINE_LINUX=""\n'
    )


def bind(root: Path, address: str, driver: str | None) -> None:
    """Bind ``address`` to ``driver`` (None: unbind) as sysfs shows it: the driver link and uevent's DRIVER."""
    dev = device_dir(root, address)
    uevent = dev / "uevent"
    text = uevent.read_text() if uevent.exists() else ""
    lines = [line for line in text.splitlines() if not line.startswith("DRIVER=")]
    link = dev / "driver"
    if link.is_symlink():
        link.unlink()
    if driver is not None:
        drivers = root / "sys/bus/pci/drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(drivers, dev))
        lines.insert(0, f"DRIVER={driver}")
    uevent.write_text("\n".join(lines) + "\n")


def move(root: Path, address: str, new: str) -> None:
    """The device at ``address`` now sits at ``new`` (another slot, or a renumbered bus)."""
    dev = device_dir(root, address)
    moved = dev.with_name(new)
    dev.rename(moved)
    uevent = moved / "uevent"
    uevent.write_text(uevent.read_text().replace(f"PCI_SLOT_NAME={address}", f"PCI_SLOT_NAME={new}"))
    links = root / "sys/bus/pci/devices"
    (links / address).unlink()
    (links / new).symlink_to(os.path.relpath(moved, links))


def remove_mdev(root: Path, uuid: str) -> None:
    """The mdev is gone: its folder and every link to it."""
    real = (root / "sys/bus/mdev/devices" / uuid).resolve()
    for link in root.glob(f"sys/**/{uuid}"):
        if link.is_symlink():
            link.unlink()
    shutil.rmtree(real)


def off_the_bus(root: Path, address: str) -> None:
    """The GPU no longer answers: its config space reads all ones."""
    config = device_dir(root, address) / "config"
    config.write_bytes(b"\xff" * len(config.read_bytes()))


def kernel_log(root: Path, text: str) -> None:
    (root / "var/log").mkdir(parents=True, exist_ok=True)
    (root / "var/log/kern.log").write_text(text)


def aer(root: Path, address: str, fatal: int) -> None:
    dev = device_dir(root, address)
    (dev / "aer_dev_correctable").write_text("RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n")
    (dev / "aer_dev_nonfatal").write_text("Undefined 0\nDLP 0\nTOTAL_ERR_NONFATAL 0\n")
    (dev / "aer_dev_fatal").write_text(f"Undefined 0\nSurpriseDown {fatal}\nTOTAL_ERR_FATAL {fatal}\n")


def passthrough(address: str = EDU) -> dict[str, Any]:
    return {"version": 1, "gpus": [{"name": "gpu", "address": address, "use": "passthrough", "expect": "1234:11e8"}]}


def mdev_host() -> dict[str, Any]:
    instance = {"type": "mtty-2", "uuid": MTTY_UUID}
    return {"version": 1, "gpus": [{"name": "serial", "address": "mtty", "use": "mdev", "instances": [instance]}]}


def kept(address: str = H100) -> dict[str, Any]:
    return {"version": 1, "gpus": [{"name": "gpu", "address": address, "use": "host"}]}


XID_LOG = (
    "Nov 22 10:00:00 host kernel: [  10.1] nvidia 0000:00:06.0: enabling device (0000 -> 0003)\n"
    "Nov 22 10:05:00 host kernel: [ 310.2] NVRM: Xid (PCI:0000:00:06): 79, pid=0, GPU has fallen off the bus.\n"
    "Nov 22 10:05:02 host kernel: [ 312.0] pci 0000:00:06.0: not ready 65535ms after FLR; giving up\n"
)


def converged(kind: str, root: Path) -> tuple[Path, dict[str, Any]]:
    """A converged host of ``kind`` (passthrough, mdev, host) staged at ``root``, and its declaration."""
    if kind == "passthrough":
        unpack("gpu-alone", root)
        bind(root, EDU, "vfio-pci")
        grub_as_booted(root)
        return root, passthrough()
    if kind == "mdev":
        unpack("mtty-mdev", root)
        grub_as_booted(root)
        return root, mdev_host()
    unpack("h100-live", root)
    return root, kept()


# name -> (kind, change or None, what the report must say of it)
HELD_OUT: dict[str, tuple[str, str | None]] = {
    "pt-ok": ("passthrough", None),
    "pt-moved": ("passthrough", "move"),
    "pt-unbound": ("passthrough", "unbind"),
    "mdev-ok": ("mdev", None),
    "mdev-gone": ("mdev", "remove-mdev"),
    "h100-ok": ("host", None),
    "h100-off-bus": ("host", "off-the-bus"),
    "h100-log": ("host", "log"),
}
MOVED_TO = "0000:05:00.0"


def change(root: Path, what: str | None) -> None:
    if what == "move":
        move(root, EDU, MOVED_TO)
    elif what == "unbind":
        bind(root, EDU, None)
    elif what == "remove-mdev":
        remove_mdev(root, MTTY_UUID)
    elif what == "off-the-bus":
        off_the_bus(root, H100)
    elif what == "log":
        kernel_log(root, XID_LOG)
        aer(root, H100, 2)


def stage_fleet(dest: Path, hosts: dict[str, tuple[str, str | None]] = HELD_OUT) -> dict[str, dict[str, Any]]:
    """Inventory host variables per host name: local connection, its staged root, its declaration."""
    out = {}
    for name, (kind, what) in hosts.items():
        root, declaration = converged(kind, dest / name)
        change(root, what)
        out[name] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "gpuprov_root": str(root),
            "gpuprov_host": declaration,
        }
    return out
