#!/usr/bin/env python3
"""Boot emulated GPU-passthrough hosts under QEMU TCG and capture each as a fixture.

    dev/emuhost/capture-topologies.py [--list] [NAME...]

For each topology (all of them when no NAME is given) this boots QEMU's q35 with
an emulated Intel IOMMU, Debian 12's own kernel and a busybox + Python 3.11
initramfs, arranges the host (drivers, routes, swap, mounts, vfio binds), runs
`python3 -m gpuprov capture` from this working tree inside it and writes
tests/fixtures/hosts/<name>.tar.gz.  QEMU's `edu` device (1234:11e8) stands in
for a GPU.

Everything in the guest comes from Debian packages (`apt-get download`, never
installed here).  Downloads, the kernel and the base initramfs are cached under
$XDG_CACHE_HOME/gpuprov/emuhost/ (key: package versions + this script + init);
gpuprov/ and the topology's setup go into a small second cpio appended per run,
so editing gpuprov never rebuilds the cache.  Each topology's last run (console
log, setup and capture logs) stays in $XDG_CACHE_HOME/gpuprov/emuhost/runs/NAME/.
Needs: apt-get (Debian 12 sources), dpkg-deb, qemu-system-x86_64 (TCG; no KVM
needed), Python 3.8+; for mtty-mdev also make and gcc-12.  No root needed.
"""

import argparse
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
from dev.lab import debpkg  # noqa: E402  (the package-download/mtty helpers the lab uses too)
from gpuprov.cli import rootfs  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "hosts"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuprov" / "emuhost"

# Debian packages the guest is made of.  linux-image-amd64 is resolved to the
# versioned image package it depends on.
PACKAGES = [
    "linux-image-amd64",
    "busybox-static",
    "base-files",
    "libc6",
    "zlib1g",
    "libexpat1",
    "libbz2-1.0",
    "liblzma5",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
]
# Shared libraries python3.11 and the kept lib-dynload modules link against.
LIBS = ["ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libz.so.1", "libexpat.so.1", "libbz2.so.1.0", "liblzma.so.5"]
# Kernel modules in the initramfs (their dependencies come along): drivers for
# every emulated device, so the captured host has drivers bound like a real one.
MODULES = [
    "vfio",
    "vfio_iommu_type1",
    "vfio-pci",
    "mdev",
    "nvme",
    "e1000",
    "e1000e",
    "snd-hda-intel",
    "snd-hda-codec-generic",
    "bochs",
    "ahci",
    "lpc_ich",
    "i2c-i801",
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "ext4",
    "crc32c_generic",
]

KERNEL_ARGS = "console=ttyS0 intel_iommu=on iommu=pt panic=-1"
# The emulated host machine (debpkg.QEMU_HOST), as a capture boots it.
QEMU = [*debpkg.QEMU_HOST, "-smp", "2", "-m", "1024", "-nodefaults", "-display", "none", "-no-reboot"]


def rp(n, dev):
    """A pcie-root-port rpN at 00:0N.0 with DEV (a -device string) behind it."""
    return ["-device", f"pcie-root-port,id=rp{n},bus=pcie.0,addr={n:#x},chassis={n}", "-device", f"{dev},bus=rp{n}"]


def nvme(n, serial, drive, bus):
    return [
        "-drive",
        f"file={drive}.img,if=none,format=raw,id={drive}",
        "-device",
        f"nvme,serial={serial},drive={drive},bus={bus}",
    ]


# The rest of a host: an onboard-style e1000e NIC on rp5 (the default route) and
# an NVMe system disk on rp6 (ext4 at /srv), each on its own root port.
NIC = [*rp(5, "e1000e,netdev=n0,mac=52:54:00:00:00:05"), "-netdev", "user,id=n0,restrict=on"]
SYSDISK = ["-device", "pcie-root-port,id=rp6,bus=pcie.0,addr=0x6,chassis=6", *nvme(6, "EMUSYS0001", "sys", "rp6")]
NIC_UP = "static_route $(nic_of $(pci_by_id 8086:10d3))\n"
SYSDISK_UP = """\
d=$(nvme_by_serial EMUSYS0001)
mke2fs -q $d > /dev/null
mkdir -p /srv
mount -t ext4 $d /srv
"""
DISKS = {"sys": 64}  # image name -> MiB, created empty per run

TOPOLOGIES = {
    "gpu-alone": dict(
        doc="edu alone behind its own root port; NIC and NVMe elsewhere",
        qemu=rp(1, "edu") + NIC + SYSDISK,
        guest=NIC_UP + SYSDISK_UP,
    ),
    "gpu-audio": dict(
        doc="edu (fn 0) + ich9-intel-hda audio (fn 1) in one slot behind a root port",
        qemu=[
            "-device",
            "pcie-root-port,id=rp1,bus=pcie.0,addr=0x1,chassis=1",
            "-device",
            "edu,bus=rp1,addr=0x0.0,multifunction=on",
            "-device",
            "ich9-intel-hda,id=hda,bus=rp1,addr=0x0.1",
            "-audiodev",
            "none,id=snd0",
            "-device",
            "hda-output,bus=hda.0,audiodev=snd0",
            *NIC,
            *SYSDISK,
        ],
        guest=NIC_UP + SYSDISK_UP,
    ),
    "gpu-bridge-nic": dict(
        doc="edu and an e1000 NIC behind one pcie-pci-bridge; the NIC has the default route",
        qemu=[
            "-device",
            "pcie-root-port,id=rp1,bus=pcie.0,addr=0x1,chassis=1",
            "-device",
            "pcie-pci-bridge,id=br1,bus=rp1",
            "-device",
            "edu,bus=br1,addr=0x1",
            "-device",
            "e1000,netdev=n0,mac=52:54:00:00:00:02,bus=br1,addr=0x2",
            "-netdev",
            "user,id=n0,restrict=on",
            *SYSDISK,
        ],
        guest="static_route $(nic_of $(pci_by_id 8086:100e))\n" + SYSDISK_UP,
    ),
    "boot-vga": dict(
        doc="a std VGA on the root bus is the boot VGA; an edu and a secondary-vga (display "
        "class, not boot VGA) sit behind root ports",
        qemu=["-device", "VGA,bus=pcie.0,addr=0x2", *rp(1, "edu"), *rp(3, "secondary-vga"), *NIC, *SYSDISK],
        guest=NIC_UP + SYSDISK_UP,
    ),
    "nvme-swap": dict(
        doc="consumer-chipset style: two root ports as functions of slot 00:1c without ACS, "
        "an edu behind one and a data NVMe behind the other, so all four share a group; "
        "the NVMe holds swap (p2) and an ext4 mount (p1, /var/lib/libvirt/images)",
        qemu=[
            "-device",
            "pcie-root-port,id=pch0,bus=pcie.0,addr=0x1c.0,multifunction=on,chassis=10,disable-acs=on",
            "-device",
            "pcie-root-port,id=pch1,bus=pcie.0,addr=0x1c.1,chassis=11,disable-acs=on",
            "-device",
            "edu,bus=pch0",
            *nvme(2, "EMUDATA0002", "data", "pch1"),
            *NIC,
            *SYSDISK,
        ],
        disks={"data": 96},
        guest=NIC_UP
        + SYSDISK_UP
        + """\
d=$(nvme_by_serial EMUDATA0002)
printf 'n\\np\\n1\\n\\n+48M\\nn\\np\\n2\\n\\n\\nt\\n2\\n82\\nw\\n' | fdisk $d
mke2fs -q ${d}p1 > /dev/null
mkdir -p /var/lib/libvirt/images
mount -t ext4 ${d}p1 /var/lib/libvirt/images
mkswap ${d}p2
swapon ${d}p2
""",
    ),
    "gpu-switch": dict(
        doc="edu and a data NVMe behind two downstream ports of one PCIe switch (x3130, "
        "whose downstream ports have no ACS): each device shares a group with its port",
        qemu=[
            "-device",
            "pcie-root-port,id=rp1,bus=pcie.0,addr=0x1,chassis=1",
            "-device",
            "x3130-upstream,id=up1,bus=rp1",
            "-device",
            "xio3130-downstream,id=dp1,bus=up1,chassis=11,slot=0",
            "-device",
            "xio3130-downstream,id=dp2,bus=up1,chassis=12,slot=0",
            "-device",
            "edu,bus=dp1",
            *nvme(2, "EMUDATA0002", "data", "dp2"),
            *NIC,
            *SYSDISK,
        ],
        disks={"data": 32},
        guest=NIC_UP + SYSDISK_UP,
    ),
    "vfio-bound": dict(
        doc="gpu-alone with the edu bound to vfio-pci and /dev/vfio/N held open by a process",
        qemu=rp(1, "edu") + NIC + SYSDISK,
        guest=NIC_UP
        + SYSDISK_UP
        + """\
gpu=$(pci_by_id 1234:11e8)
bind_vfio $gpu
g=$(basename $(readlink /sys/bus/pci/devices/$gpu/iommu_group))
# A stand-in for a VM that has the group open: the capture sees it in use.
setsid sleep 100000 < /dev/vfio/$g > /dev/null 2>&1 &
sleep 1
""",
    ),
    "mtty-mdev": dict(
        doc="gpu-alone plus the kernel's mtty sample mdev parent (built out of tree) with one mtty-2 instance created",
        qemu=rp(1, "edu") + NIC + SYSDISK,
        mtty=True,
        guest=NIC_UP
        + SYSDISK_UP
        + """\
modprobe mdev
insmod /lib/modules/$(uname -r)/extra/mtty.ko
echo 83b8f4f2-509f-382f-3c1e-e6bfe0fa1001 > /sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2/create
""",
    ),
}


def sh(cmd, **kw):
    try:
        return debpkg.sh(cmd, **kw)
    except debpkg.CommandError as exc:
        sys.exit(str(exc))


def resolve_packages():
    """name -> candidate version, with linux-image-amd64 replaced by the image it pulls."""
    try:
        return debpkg.resolve(PACKAGES)
    except debpkg.CommandError as exc:
        sys.exit(str(exc))


def download(pkgs):
    try:
        return debpkg.download(pkgs, CACHE / "debs")
    except debpkg.CommandError as exc:
        sys.exit(str(exc))


def cpio(entries, out):
    """A newc cpio (debpkg.cpio: root-owned files, /dev/console without root)."""
    debpkg.cpio(entries, Path(out))


def tree_entries(root, prefix="."):
    """cpio entries for everything under root, placed under prefix (parents first)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.normpath(os.path.join(prefix, os.path.relpath(dirpath, root)))
        if rel != ".":
            yield rel, stat.S_IFDIR | 0o755, b""
        for fn in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            p, name = os.path.join(dirpath, fn), os.path.normpath(os.path.join(rel, fn))
            if os.path.islink(p):
                yield name, stat.S_IFLNK | 0o777, os.readlink(p)
            else:
                yield name, stat.S_IFREG | (os.stat(p).st_mode & 0o777), Path(p).read_bytes()


def build_base(debs, kver, out):
    """Extract the debs and assemble the base initramfs (out/base.cpio) and kernel."""
    with tempfile.TemporaryDirectory(prefix="emuhost-") as tmp:
        x, root = Path(tmp, "x"), Path(tmp, "root")
        for deb in debs:
            sh(["dpkg-deb", "-x", str(deb), str(x)])
        bb = x / "bin" / "busybox"
        (root / "bin").mkdir(parents=True)
        shutil.copy(bb, root / "bin" / "busybox")
        os.symlink("busybox", root / "bin" / "sh")
        shutil.copy(HERE / "init", root / "init")
        (root / "init").chmod(0o755)
        # os-release from base-files: the capture records which distribution this is.
        (root / "etc").mkdir()
        (root / "usr" / "lib").mkdir(parents=True)
        shutil.copy(x / "usr/lib/os-release", root / "usr/lib/os-release")
        os.symlink("../usr/lib/os-release", root / "etc/os-release")

        # Python: the interpreter, its libraries, and the stdlib minus lib-dynload
        # modules that need a library left out (ssl, sqlite, curses, ...) and tests.
        (root / "usr/bin").mkdir(parents=True)
        shutil.copy(x / "usr/bin/python3.11", root / "usr/bin/python3.11")
        os.symlink("python3.11", root / "usr/bin/python3")
        libdir = root / "lib/x86_64-linux-gnu"
        libdir.mkdir(parents=True)
        for lib in LIBS:
            src = next(p for d in ("lib", "usr/lib") for p in [x / d / "x86_64-linux-gnu" / lib] if p.exists())
            shutil.copy(src.resolve(), libdir / lib)
        (root / "lib64").mkdir()
        os.symlink("../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", root / "lib64/ld-linux-x86-64.so.2")
        stdlib = root / "usr/lib/python3.11"
        shutil.copytree(
            x / "usr/lib/python3.11",
            stdlib,
            symlinks=True,
            ignore=shutil.ignore_patterns("test", "pydoc_data", "__pycache__", "*_test*", "xx*"),
        )
        for so in (stdlib / "lib-dynload").glob("*.so"):
            needed = set(re.findall(rb"lib[\w+-]+\.so\.[\d.]*\d", so.read_bytes())) - {so.name.encode()}
            if not {n.decode() for n in needed} <= set(LIBS):
                so.unlink()
        # Precompile with the guest's own interpreter (run here through its ld.so):
        # compiling on first import costs seconds under TCG.
        subprocess.run(
            [
                str(libdir / "ld-linux-x86-64.so.2"),
                "--library-path",
                str(libdir),
                str(root / "usr/bin/python3.11"),
                "-m",
                "compileall",
                "-q",
                "-j0",
                "--invalidation-mode",
                "unchecked-hash",
                "-s",
                str(root),
                "-p",
                "/",
                str(stdlib),
            ],
            check=True,
            env={"PYTHONHOME": str(root / "usr")},
        )

        # Kernel modules: the closure of MODULES over modules.dep, then a depmod of
        # just those for the guest's busybox modprobe.
        mods = x / "lib/modules" / kver
        sh([str(bb), "depmod", "-b", str(x), kver])
        deps = {}
        for line in (mods / "modules.dep").read_text().splitlines():
            k, _, v = line.partition(":")
            deps[k] = v.split()
        byname = {Path(k).name[:-3].replace("-", "_"): k for k in deps}
        todo, keep = [byname[m.replace("-", "_")] for m in MODULES], set()
        while todo:
            k = todo.pop()
            if k not in keep:
                keep.add(k)
                todo += deps[k]
        gmods = root / "lib/modules" / kver
        for k in keep:
            (gmods / k).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(mods / k, gmods / k)
        for f in ("modules.builtin", "modules.order"):
            shutil.copy(mods / f, gmods / f)
        sh([str(bb), "depmod", "-b", str(root), kver])

        # /dev/console must exist before init runs: the kernel opens it for PID 1.
        entries = [
            ("dev", stat.S_IFDIR | 0o755, b""),
            ("dev/console", stat.S_IFCHR | 0o600, b"", (5, 1)),
            ("proc", stat.S_IFDIR | 0o755, b""),
            ("sys", stat.S_IFDIR | 0o755, b""),
            # The kernel runs /sbin/modprobe for fs types and crypto (ext4's crc32c).
            ("sbin", stat.S_IFLNK | 0o777, "bin"),
        ]
        tmp_cpio = out / "base.cpio.tmp"
        cpio(entries + list(tree_entries(root)), tmp_cpio)
        shutil.copy(x / "boot" / f"vmlinuz-{kver}", out / "vmlinuz")
        tmp_cpio.rename(out / "base.cpio")


def build_mtty(kver, out):
    """mtty.ko (samples/vfio-mdev, not in Debian's kernel) built against Debian's headers."""
    try:
        return debpkg.build_mtty(kver, out / "mtty.ko", CACHE / "debs")
    except debpkg.CommandError as exc:
        sys.exit(str(exc))


def prepare():
    pkgs = resolve_packages()
    kver = next(n for n in pkgs if n.startswith("linux-image-"))[len("linux-image-") :]
    h = hashlib.sha256()
    for n, v in sorted(pkgs.items()):
        h.update(f"{n}={v}\n".encode())
    for f in (Path(__file__), HERE / "init"):
        h.update(f.read_bytes())
    out = CACHE / h.hexdigest()[:16]
    if not (out / "base.cpio").exists():
        t = time.monotonic()
        out.mkdir(parents=True, exist_ok=True)
        build_base(download(pkgs), kver, out)
        print(f"built {out} in {time.monotonic() - t:.0f} s", file=sys.stderr)
        for old in CACHE.iterdir():  # builds for older inputs: never used again
            if re.fullmatch(r"[0-9a-f]{16}", old.name) and old != out:
                shutil.rmtree(old)
    return out, kver


def overlay(name, topo, path, extra):
    """The per-run cpio: gpuprov/ from this working tree, the topology's setup and extra files."""
    entries = [
        ("opt", stat.S_IFDIR | 0o755, b""),
        ("opt/gpuprov", stat.S_IFDIR | 0o755, b""),
        ("etc/emuhost", stat.S_IFDIR | 0o755, b""),
        ("etc/emuhost/name", stat.S_IFREG | 0o644, name + "\n"),
        ("etc/emuhost/topo.sh", stat.S_IFREG | 0o644, topo["guest"]),
    ]
    entries += [e for e in tree_entries(REPO / "gpuprov", "opt/gpuprov/gpuprov") if "__pycache__" not in e[0]]
    cpio(entries + extra, path)


def boot(name, topo, base, kver):
    # The run dir (disk images, console.log, qemu.log, the 9p share with setup.log
    # and capture.log) stays until the next run of this topology.
    run = CACHE / "runs" / name
    shutil.rmtree(run, ignore_errors=True)
    share = run / "out"
    share.mkdir(parents=True)
    extra = []
    if topo.get("mtty"):
        extra = [
            (f"lib/modules/{kver}/extra", stat.S_IFDIR | 0o755, b""),
            (f"lib/modules/{kver}/extra/mtty.ko", stat.S_IFREG | 0o644, build_mtty(kver, base).read_bytes()),
        ]
    overlay(name, topo, run / "overlay.cpio", extra)
    with open(run / "initrd", "wb") as f:  # concatenated cpio archives: the kernel unpacks both
        for part in (base / "base.cpio", run / "overlay.cpio"):
            with open(part, "rb") as p:
                shutil.copyfileobj(p, f)
    for disk, mib in {**DISKS, **topo.get("disks", {})}.items():
        with open(run / f"{disk}.img", "wb") as f:
            f.truncate(mib << 20)
    cmd = (
        QEMU
        + [
            "-kernel",
            str(base / "vmlinuz"),
            "-initrd",
            str(run / "initrd"),
            "-append",
            KERNEL_ARGS,
            "-serial",
            f"file:{run / 'console.log'}",
            # The 9p share the tarball leaves through, at a fixed 00:1e.0.
            "-fsdev",
            f"local,id=out,path={share},security_model=none",
            "-device",
            "virtio-9p-pci,fsdev=out,mount_tag=out,bus=pcie.0,addr=0x1e",
        ]
        + topo["qemu"]
    )
    t = time.monotonic()
    with open(run / "qemu.log", "wb") as log:
        rc = subprocess.run(["timeout", "300", *cmd], cwd=run, stdout=log, stderr=subprocess.STDOUT).returncode
    secs = time.monotonic() - t
    (run / "initrd").unlink()  # 50 MB, rebuilt each run anyway
    tarball = share / f"{name}.tar.gz"
    ok = rc == 0 and tarball.exists()
    if ok:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        shutil.copy(tarball, FIXTURES / tarball.name)
    print(f"{name}: {'ok' if ok else 'FAILED'} (qemu rc {rc}, {secs:.0f} s; logs in {run})")
    if ok:
        summarize(FIXTURES / tarball.name)
    else:
        for f in (share / "setup.log", share / "capture.log", run / "console.log"):
            if f.exists():
                print(f"--- {f.name} (tail)\n" + f.read_text(errors="replace")[-3000:])
    return ok


def summarize(tarball):
    """Print each PCI device's IOMMU group, class, driver and boot_vga from a capture."""

    def read(p):
        return p.read_text().strip() if p.is_file() else "?"

    def link(p):
        return os.path.basename(os.readlink(p)) if p.is_symlink() else "-"

    with tempfile.TemporaryDirectory() as root:
        rootfs.unpack(str(tarball), root)  # the one safe reader gpuprov inspect --root uses
        for dev in sorted(Path(root, "sys/bus/pci/devices").iterdir()):
            vga = dev / "boot_vga"
            cls = re.search(r"^PCI_CLASS=(\w+)", read(dev / "uevent"), re.M)  # class file may be left out
            cls = cls.group(1) if cls else read(dev / "class")
            print(
                f"  {dev.name} class {cls} group {link(dev / 'iommu_group')} driver {link(dev / 'driver')}"
                + (f" boot_vga {read(vga)}" if vga.exists() else "")
            )
    print(f"  {os.path.getsize(tarball)} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="topologies (default: all)")
    ap.add_argument("--list", action="store_true", help="list topologies and exit")
    a = ap.parse_args()
    if a.list:
        for n, t in TOPOLOGIES.items():
            print(f"{n:16} {t['doc']}")
        return 0
    bad = [n for n in a.names if n not in TOPOLOGIES]
    if bad:
        ap.error(f"unknown topology: {' '.join(bad)} (see --list)")
    base, kver = prepare()
    results = [boot(n, TOPOLOGIES[n], base, kver) for n in a.names or TOPOLOGIES]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
