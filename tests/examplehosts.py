"""The hosts the project's own examples are written for (issue #50): the README's "Ten minutes" host,
which inventories/example's gpu-node-01 declares too, and gpu-node-02 with two H100s for the example's
group_vars layout. Built with tests/fakehost.py and written as captures by ``gpuprov capture``'s own
code, so a newcomer plans each example against the capture shipped beside it:

    gpuprov plan --root inventories/example-captures/gpu-node-01.tar.gz -i inventories/example --host gpu-node-01

    python -m tests.examplehosts     # rebuild inventories/example-captures/*.tar.gz
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.fakehost import FakeHost
from tests.vmhosts import GIB_KIB, add_numa

# Beside the inventory, not in it: Ansible would read every file of the inventory folder as a source.
CAPTURES = Path(__file__).resolve().parents[1] / "inventories" / "example-captures"
IOMMU_ARGS = "BOOT_IMAGE=/vmlinuz-6.1.0-28-amd64 root=/dev/sda1 ro quiet intel_iommu=on iommu=pt"


def _common(root: Path) -> FakeHost:
    fake = FakeHost(root)
    fake.cmdline = IOMMU_ARGS
    # GRUB configures what the host booted with: no reboot owed, and the playbook's dry run reads it.
    fake.write("etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on iommu=pt"\n')
    fake.write("usr/sbin/update-grub", "#!/bin/sh\n")
    fake.write("etc/os-release", 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n')
    fake.write("sys/class/iommu/dmar0/devices/.keep", "")
    fake.pci("0000:00:00.0", cls=0x060000, vendor=0x8086, device=0x1234, group=0, numa_node=0)
    # The console's GPU, on the boot display: it stays with the host.
    fake.pci(
        "0000:01:00.0", cls=0x030000, vendor=0x10DE, device=0x1EB8, group=1, numa_node=0, boot_vga=True, driver="nvidia"
    )
    fake.framebuffer("0000:01:00.0")
    add_numa(fake, [("0-31", 256 * GIB_KIB, {}), ("32-63", 256 * GIB_KIB, {})])
    return fake


def gpu_node_01(root: Path) -> Path:
    """The README's host: the console GPU, an H100 (and its audio function) for a training VM on
    node 0, a V100 with the vGPU Manager's mdev types on node 1."""
    fake = _common(root)
    fake.pci("0000:40:01.0", cls=0x060400, vendor=0x8086, device=0x2345, group=40, numa_node=0, driver="pcieport")
    fake.pci("0000:41:00.0", cls=0x030200, parent="0000:40:01.0", group=41, numa_node=0, driver="nvidia")
    fake.pci("0000:41:00.1", cls=0x040300, parent="0000:40:01.0", group=41, numa_node=0, driver="snd_hda_intel")
    fake.pci("0000:80:01.0", cls=0x060400, vendor=0x8086, device=0x2345, group=80, numa_node=1, driver="pcieport")
    fake.pci("0000:81:00.0", cls=0x030200, device=0x1DB4, parent="0000:80:01.0", group=81, numa_node=1, driver="nvidia")
    bars(fake, "0000:41:00.0", [16 << 20, 128 << 30, 32 << 20])  # an H100's BAR0, BAR1 (128 GiB), BAR3
    bars(fake, "0000:41:00.1", [16 << 10])
    fake.mdev_types("0000:81:00.0", {"nvidia-259": ("GRID V100-8Q", 4), "nvidia-260": ("GRID V100-16Q", 2)})
    fake.write("proc/modules", "nvidia 56000000 0 - Live 0x0000000000000000\n")
    return fake.finish()


def gpu_node_02(root: Path) -> Path:
    """Two H100s, one per NUMA node, for group_vars' layout h100-passthrough (train[0], train[1])."""
    fake = _common(root)
    for node, bus in ((0, 0x41), (1, 0xC1)):
        bridge = f"0000:{bus - 1:02x}:01.0"
        fake.pci(bridge, cls=0x060400, vendor=0x8086, device=0x2345, group=bus - 1, numa_node=node, driver="pcieport")
        fake.pci(f"0000:{bus:02x}:00.0", cls=0x030200, parent=bridge, group=bus, numa_node=node, driver="nvidia")
        bars(fake, f"0000:{bus:02x}:00.0", [16 << 20, 128 << 30, 32 << 20])
    return fake.finish()


def bars(fake: FakeHost, address: str, sizes: list[int]) -> None:
    """The device's ``resource`` file: each BAR's start, end and flags (64-bit prefetchable memory)."""
    lines, start = [], 0x38_0000_0000_00
    for size in sizes:
        lines.append(f"0x{start:016x} 0x{start + size - 1:016x} 0x000000000014220c")
        start += size
    lines += ["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * (13 - len(sizes))
    fake.write(f"{fake.paths[address]}/resource", "\n".join(lines) + "\n")


HOSTS = {"gpu-node-01": gpu_node_01, "gpu-node-02": gpu_node_02}


def write_captures(dest: Path = CAPTURES) -> list[Path]:
    """Each example host as ``gpuprov capture`` writes it (no commands run: a built root)."""
    from gpuprov.cli.capture import capture

    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, build in HOSTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            root = build(Path(tmp) / "root")
            path = dest / f"{name}.tar.gz"
            capture(str(path), str(root), run_commands=False)
            out.append(path)
    return out


if __name__ == "__main__":
    for written in write_captures(Path(sys.argv[1]) if len(sys.argv) > 1 else CAPTURES):
        print(written)
