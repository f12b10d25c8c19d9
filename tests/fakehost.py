"""Build small sysfs/procfs trees as input data for unit tests.

The layout mirrors the kernel's (and the real captures under tests/fixtures):
devices under sys/devices/pciDDDD:BB/..., relative symlinks from
sys/bus/pci/devices, iommu_groups, class directories. Used only to feed the
readers cases that no captured host shows; end-to-end runs use real hosts.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path


def _ip_hex(addr: str) -> str:
    return f"{struct.unpack('=I', socket.inet_aton(addr))[0]:08X}"


class FakeHost:
    def __init__(self, root: Path, *, iommu: bool = True, cpu_vendor: str = "GenuineIntel") -> None:
        self.root = root
        self.paths: dict[str, str] = {}  # address -> root-relative device dir
        self.routes: list[tuple[str, str, str, str]] = []
        self.locals: list[str] = []
        self.mounts: list[tuple[str, str]] = [("sysfs", "/sys"), ("proc", "/proc")]
        self.swaps: list[str] = []
        self.cmdline = "BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 ro quiet"
        for d in ("sys/bus/pci/devices", "sys/kernel/iommu_groups", "sys/class/net", "sys/class/block", "proc"):
            (root / d).mkdir(parents=True, exist_ok=True)
        self.write("proc/version", "Linux version 6.1.0-test (builder) #1 SMP\n")
        self.write("proc/cpuinfo", f"processor\t: 0\nvendor_id\t: {cpu_vendor}\n\n")
        self.write("proc/modules", "")
        self.write("etc/os-release", 'PRETTY_NAME="Fake Linux 1"\n')
        if iommu:
            self.cmdline += " intel_iommu=on iommu=pt"
            self.write("sys/class/iommu/dmar0/intel-iommu/ecap", "f020df\n")

    # -------------------------------------------------------------- primitives

    def write(self, rel: str, text: str | bytes) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)

    def link(self, rel: str, target_rel: str) -> None:
        """A relative symlink at ``rel`` pointing at root-relative ``target_rel``."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        os.symlink(os.path.relpath(self.root / target_rel, path.parent), path)

    # -------------------------------------------------------------- devices

    def pci(
        self,
        address: str,
        *,
        cls: int,
        vendor: int = 0x10DE,
        device: int = 0x2330,
        driver: str | None = None,
        group: int | None = None,
        parent: str | None = None,
        boot_vga: bool | None = None,
        reset: str | None = "flr bus",
        link: tuple[float, int, float, int] | None = (16.0, 16, 16.0, 16),
        numa_node: int = -1,
        sriov_totalvfs: int | None = None,
        physfn: str | None = None,
    ) -> str:
        bus_root = f"sys/devices/pci{address[:-5]}" if parent is None else self.paths[parent]
        base = f"{bus_root}/{address}"
        self.paths[address] = base
        attrs = {
            "vendor": f"0x{vendor:04x}",
            "device": f"0x{device:04x}",
            "subsystem_vendor": f"0x{vendor:04x}",
            "subsystem_device": "0x0000",
            "class": f"0x{cls:06x}",
            "revision": "0xa1",
            "driver_override": "(null)",
            "numa_node": str(numa_node),
            "local_cpulist": "0-7",
        }
        if reset is not None:
            attrs["reset_method"] = reset
        if link is not None:
            attrs["current_link_speed"] = f"{link[0]:.1f} GT/s PCIe"
            attrs["current_link_width"] = str(link[1])
            attrs["max_link_speed"] = f"{link[2]:.1f} GT/s PCIe"
            attrs["max_link_width"] = str(link[3])
        if boot_vga is not None or cls >> 8 == 0x0300:  # the kernel shows it on every VGA device
            attrs["boot_vga"] = "1" if boot_vga else "0"
        if sriov_totalvfs is not None:
            attrs["sriov_totalvfs"] = str(sriov_totalvfs)
            attrs["sriov_numvfs"] = "0"
        for name, value in attrs.items():
            self.write(f"{base}/{name}", value + "\n")
        self.link(f"sys/bus/pci/devices/{address}", base)
        if driver:
            (self.root / "sys/bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
            self.link(f"{base}/driver", f"sys/bus/pci/drivers/{driver}")
            self.link(f"sys/bus/pci/drivers/{driver}/{address}", base)
        if group is not None:
            gdir = f"sys/kernel/iommu_groups/{group}"
            self.write(f"{gdir}/type", "identity\n")
            self.link(f"{gdir}/devices/{address}", base)
            self.link(f"{base}/iommu_group", gdir)
        if physfn is not None:
            self.link(f"{base}/physfn", self.paths[physfn])
            pf = self.paths[physfn]
            index = len([e for e in os.listdir(self.root / pf) if e.startswith("virtfn")])
            self.link(f"{pf}/virtfn{index}", base)
            self.write(f"{pf}/sriov_numvfs", f"{index + 1}\n")
        return base

    def net(
        self,
        ifname: str,
        address: str | None,
        *,
        ipv4: str | None = None,
        prefix: int = 24,
        gateway: str | None = None,
        master: str | None = None,
    ) -> None:
        base = f"{self.paths[address]}/net/{ifname}" if address else f"sys/devices/virtual/net/{ifname}"
        self.write(f"{base}/operstate", "up\n")
        self.link(f"sys/class/net/{ifname}", base)
        if master:
            self.link(f"{base}/master", f"sys/devices/virtual/net/{master}")
        if ipv4:
            net = socket.inet_ntoa(
                struct.pack("!I", struct.unpack("!I", socket.inet_aton(ipv4))[0] & (0xFFFFFFFF << (32 - prefix)))
            )
            mask = socket.inet_ntoa(struct.pack("!I", (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF))
            self.routes.append((ifname, net, "0.0.0.0", mask))
            self.locals.append(ipv4)
        if gateway:
            self.routes.append((ifname, "0.0.0.0", gateway, "0.0.0.0"))

    def block(self, name: str, address: str | None, *, partitions: tuple[str, ...] = ()) -> None:
        base = f"{self.paths[address]}/nvme/nvme0/{name}" if address else f"sys/devices/virtual/block/{name}"
        self.write(f"{base}/size", "1000\n")
        (self.root / base / "holders").mkdir(parents=True, exist_ok=True)
        self.link(f"sys/class/block/{name}", base)
        for part in partitions:
            self.write(f"{base}/{part}/partition", "1\n")
            (self.root / base / part / "holders").mkdir(parents=True, exist_ok=True)
            self.link(f"sys/class/block/{part}", f"{base}/{part}")

    def mount(self, device: str, mountpoint: str) -> None:
        self.mounts.append((device, mountpoint))

    def swap(self, device: str) -> None:
        self.swaps.append(device)

    def open_file(self, pid: int, comm: str, path: str, fd: int = 3) -> None:
        self.write(f"proc/{pid}/comm", comm + "\n")
        (self.root / f"proc/{pid}/fd").mkdir(parents=True, exist_ok=True)
        os.symlink(path, self.root / f"proc/{pid}/fd/{fd}")

    def framebuffer(self, address: str) -> None:
        self.link("sys/class/graphics/fb0/device", self.paths[address])

    def mdev_types(self, address: str, types: dict[str, tuple[str, int]]) -> None:
        base = self.paths[address]
        for type_id, (name, available) in types.items():
            tdir = f"{base}/mdev_supported_types/{type_id}"
            self.write(f"{tdir}/name", name + "\n")
            self.write(f"{tdir}/description", f"{name} profile\n")
            self.write(f"{tdir}/available_instances", f"{available}\n")
            self.write(f"{tdir}/device_api", "vfio-pci\n")
            (self.root / tdir / "devices").mkdir(parents=True, exist_ok=True)
        self.link(f"sys/class/mdev_bus/{address}", base)

    def mdev(self, address: str, type_id: str, uuid: str) -> None:
        base = f"{self.paths[address]}/{uuid}"
        self.link(f"{base}/mdev_type", f"{self.paths[address]}/mdev_supported_types/{type_id}")
        self.link(f"{self.paths[address]}/mdev_supported_types/{type_id}/devices/{uuid}", base)
        self.link(f"sys/bus/mdev/devices/{uuid}", base)

    def vgpu_vf(self, address: str, creatable: dict[int, str], current: int = 0) -> None:
        lines = ["ID    : vGPU Name"] + [f"{k:<5} : {v}" for k, v in creatable.items()]
        self.write(f"{self.paths[address]}/nvidia/creatable_vgpu_types", "\n".join(lines) + "\n")
        self.write(f"{self.paths[address]}/nvidia/current_vgpu_type", f"{current}\n")

    # -------------------------------------------------------------- proc

    def finish(self) -> Path:
        """Write the proc files collected so far; returns the root."""
        self.write("proc/cmdline", self.cmdline + "\n")
        self.write("proc/mounts", "".join(f"{d} {m} ext4 rw 0 0\n" for d, m in self.mounts))
        swaps = "Filename\tType\tSize\tUsed\tPriority\n" + "".join(f"{d}\tpartition\t1000\t0\t-2\n" for d in self.swaps)
        self.write("proc/swaps", swaps)
        route = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
        for iface, dest, gw, mask in self.routes:
            route += f"{iface}\t{_ip_hex(dest)}\t{_ip_hex(gw)}\t0003\t0\t0\t0\t{_ip_hex(mask)}\t0\t0\t0\n"
        self.write("proc/net/route", route)
        trie = "Main:\n  +-- 0.0.0.0/0 3 0 5\n" + "".join(
            f"     |-- {a}\n        /32 host LOCAL\n" for a in self.locals
        )
        self.write("proc/net/fib_trie", trie)
        # No IPv6 addresses or routes, as a kernel with IPv6 shows them (the tables are there, empty).
        for table in ("proc/net/if_inet6", "proc/net/ipv6_route"):
            if not (self.root / table).exists():
                self.write(table, "")
        return self.root
