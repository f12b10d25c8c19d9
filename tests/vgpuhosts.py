"""A synthetic NVIDIA vGPU host for the vGPU planner, module and molecule tests.

Built with tests/fakehost.py from the documented sysfs formats (docs/guides/mdev.md, docs/guides/sriov-vgpu.md,
NVIDIA's vGPU user guide) and the nvidia-smi MIG outputs in
tests/fixtures/vgpu/a100-80gb/ (see its README):

- ``0000:41:00.0`` A100, SR-IOV capable (16 VFs), VFs not enabled yet;
- ``0000:81:00.0`` V100 with pre-Ampere vGPU mdev types nvidia-259 "GRID V100-8Q"
  (4 available) and nvidia-260 "GRID V100-16Q" (2);
- ``0000:c1:00.0`` A100 with four VFs enabled (``c1:00.4`` to ``c1:00.7``), each
  offering types 557 "NVIDIA A100-4C" and 558 "NVIDIA A100-8C";
- ``0000:e1:00.0`` A100 80GB in MIG mode (nvidia-smi GPU 3) holding GPU
  instances 1g.10gb and 3g.40gb.

The real mdev parent (the kernel's mtty sample) is the mtty-mdev capture.

    python -m tests.vgpuhosts tests/fixtures/vgpu/nvidia-vgpu-host.tar.gz   # rebuild the tarball
"""

from __future__ import annotations

import gzip
import os
import sys
import tarfile
import tempfile
from pathlib import Path

from gpuprov.facts.host import HostFacts, gather
from gpuprov.facts.sysfs import Sysfs
from tests.fakehost import FakeHost

MIG_OUTPUTS = Path(__file__).parent / "fixtures" / "vgpu" / "a100-80gb"
TARBALL = Path(__file__).parent / "fixtures" / "vgpu" / "nvidia-vgpu-host.tar.gz"
SRIOV_PF, SRIOV_VFS = "0000:c1:00.0", ["0000:c1:00.4", "0000:c1:00.5", "0000:c1:00.6", "0000:c1:00.7"]
NEW_PF = "0000:41:00.0"
MDEV_GPU = "0000:81:00.0"
MIG_GPU = "0000:e1:00.0"
A100_TYPES = {557: "NVIDIA A100-4C", 558: "NVIDIA A100-8C"}
V100_TYPES = {"nvidia-259": ("GRID V100-8Q", 4), "nvidia-260": ("GRID V100-16Q", 2)}
VF_GROUPS = {vf: 100 + i for i, vf in enumerate(SRIOV_VFS)}


def mig_outputs(**override: str) -> dict[str, str]:
    """The captured outputs by command key, with some replaced."""
    out = {p.name: p.read_text() for p in MIG_OUTPUTS.iterdir() if p.name != "README.md"}
    out.update(override)
    return out


def render_lgi(index: int, instances: list[tuple[str, int, int, int, int]]) -> str:
    """``nvidia-smi mig -lgi`` for (name, profile ID, GI ID, start, size) rows, as the driver prints it."""
    border = "+-------------------------------------------------------+"
    lines = [
        border,
        "| GPU instances:                                        |",
        "| GPU   Name             Profile  Instance   Placement  |",
        "|                          ID       ID       Start:Size |",
        "|=======================================================|",
    ]
    for name, pid, gi, start, size in instances:
        lines += [f"|   {index}  MIG {name:<15}{pid:>4}     {gi:>4}          {start}:{size}     |", border]
    return "\n".join(lines) + "\n" if instances else "No GPU instances found: Not Found\n"


def render_lci(index: int, gis: list[tuple[int, str]]) -> str:
    """``nvidia-smi mig -lci``: one default compute instance in each (GI ID, name)."""
    border = "+--------------------------------------------------------------------+"
    lines = [
        border,
        "| Compute instances:                                                 |",
        "| GPU     GPU       Name             Profile   Instance   Placement  |",
        "|       Instance                       ID        ID       Start:Size |",
        "|         ID                                                         |",
        "|====================================================================|",
    ]
    for gi, name in gis:
        lines += [f"|   {index}    {gi:>3}       MIG {name:<16}  0         0          0:1     |", border]
    return "\n".join(lines) + "\n" if gis else "No compute instances found: Not Found\n"


def write_mig(fake: FakeHost, outputs: dict[str, str]) -> None:
    for key, text in outputs.items():
        fake.write(f"capture/nvidia-smi-mig-{key}", text)


def mdev_instance(fake: FakeHost, parent: str, type_id: str, uuid: str, group: int) -> None:
    """An mdev of ``type_id`` on ``parent`` in its own IOMMU group (as the kernel makes it)."""
    fake.mdev(parent, type_id, uuid)
    base = f"{fake.paths[parent]}/{uuid}"
    fake.write(f"sys/kernel/iommu_groups/{group}/type", "DMA\n")
    fake.link(f"{base}/iommu_group", f"sys/kernel/iommu_groups/{group}")
    fake.link(f"sys/kernel/iommu_groups/{group}/devices/{uuid}", base)
    tdir = f"{fake.paths[parent]}/mdev_supported_types/{type_id}"
    left = int((fake.root / tdir / "available_instances").read_text()) - 1
    fake.write(f"{tdir}/available_instances", f"{max(left, 0)}\n")


def running_domain(fake: FakeHost, name: str, *, mdevs: tuple[str, ...] = (), pci: tuple[str, ...] = ()) -> None:
    """libvirt's status XML of a running domain using those devices (/run/libvirt/qemu/NAME.xml)."""
    hostdevs = "".join(
        f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{u}'/></source></hostdev>"
        for u in mdevs
    )
    for addr in pci:
        dom, bus, rest = addr.split(":")
        slot, fn = rest.split(".")
        hostdevs += (
            "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
            f"<address domain='0x{dom}' bus='0x{bus}' slot='0x{slot}' function='0x{fn}'/></source></hostdev>"
        )
    fake.write(
        f"run/libvirt/qemu/{name}.xml",
        f"<domstatus state='running' pid='4242'><domain type='kvm'><name>{name}</name>"
        f"<devices>{hostdevs}</devices></domain></domstatus>\n",
    )


def build(
    root: Path,
    *,
    current: dict[str, int] | None = None,
    mig: dict[str, str] | None = None,
    sriov_manage: bool = True,
    nvidia_params: str | None = None,
    boot_runner: bool = False,
) -> FakeHost:
    """The synthetic host below ``root`` (see the module docstring); ``finish()`` is up to the caller."""
    current = current or {}
    fake = FakeHost(root)
    fake.pci("0000:00:00.0", cls=0x060000, vendor=0x8086, device=0x1234, group=0)
    fake.pci(NEW_PF, cls=0x030200, device=0x20B5, group=41, driver="nvidia", sriov_totalvfs=16)
    fake.pci(MDEV_GPU, cls=0x030200, device=0x1DB4, group=81, driver="nvidia")
    fake.mdev_types(MDEV_GPU, {t: (n, a) for t, (n, a) in V100_TYPES.items()})
    fake.pci(SRIOV_PF, cls=0x030200, device=0x20B5, group=99, driver="nvidia", sriov_totalvfs=16)
    for vf in SRIOV_VFS:
        fake.pci(vf, cls=0x030200, device=0x20B5, group=VF_GROUPS[vf], physfn=SRIOV_PF, driver="nvidia")
        taken = current.get(vf, 0)
        # The driver lists no creatable type on a VF that holds one.
        fake.vgpu_vf(vf, {} if taken else A100_TYPES, taken)
    fake.pci(MIG_GPU, cls=0x030200, device=0x20B2, group=225, driver="nvidia")
    write_mig(fake, mig if mig is not None else mig_outputs())
    if sriov_manage:
        fake.write("usr/lib/nvidia/sriov-manage", "#!/bin/sh\n# stand-in for NVIDIA's script\nexit 0\n")
    if boot_runner:  # what the role vgpu_host installs before gpu_vgpu runs (a stand-in here)
        fake.write("usr/lib/gpuprov/gpuprov-vgpu.pyz", "stand-in for the boot unit's zipapp\n")
    if nvidia_params is not None:
        fake.write("proc/driver/nvidia/params", nvidia_params)
    fake.write("proc/modules", "nvidia 56000000 0 - Live 0x0000000000000000\n")
    return fake


def facts_of(root: Path) -> HostFacts:
    return gather(Sysfs(str(root)))


def build_tarball(dest: Path) -> None:
    """The synthetic host as a capture-style tarball (relative links kept), for molecule."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        build(root).finish()
        with gzip.GzipFile(dest, "wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in sorted(dirnames + filenames):
                    path = Path(dirpath, name)
                    info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
                    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
                    if info.isfile():
                        with open(path, "rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info)


if __name__ == "__main__":
    build_tarball(Path(sys.argv[1] if len(sys.argv) > 1 else TARBALL))
