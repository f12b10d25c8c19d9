"""Issue #11 item 8: a capture keeps nothing that identifies the machine or its users
beyond what inspect needs (docs/concepts/capture-privacy.md).

A fake live host with a known MAC, hostname, serials, secrets on its kernel command
line, a VM name and vGPU UUID in nvidia-smi's XML and VPD in lspci's output (fake
commands on PATH) is captured; the whole decompressed tarball (names, link targets,
contents) is searched for every secret in every encoding, and inspect reads the
capture back to the same verdicts.
"""

from __future__ import annotations

import gzip
import ipaddress
import json
import os
import re
import socket
import struct
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.cli.capture import capture
from gpuprov.cli.main import main
from gpuprov.cli.privacy import kernel_cmdline, lspci_verbose, scrub_members, smi_xml, zero_ids
from gpuprov.cli.rootfs import unpack
from gpuprov.facts.gpus import parse_smi_xml
from gpuprov.facts.sysfs import Sysfs
from gpuprov.facts.usage import guest_digest, read_usage
from tests.fakehost import FakeHost
from tests.verify.test_verify_nvml import as_vgpu

GPU, NIC, NVME = "0000:41:00.0", "0000:42:00.0", "0000:43:00.0"
MAC = "52:54:00:12:34:56"
HOST = "secret-host-name"
USB_NIC = "enx525400123456"  # systemd's name for a USB NIC: the MAC itself
V4, V4_GW, V4_USB = "85.214.132.117", "85.214.132.1", "10.11.12.13"
V6_LINK = "fe80::5054:ff:fe12:3456"
V6_EUI = "2a01:4f8:1:2:5054:ff:fe12:3456"
V6_PRIV = "2a01:4f8:1:2:9c3d:1a2b:3c4d:5e6f"
ROOT_UUID = "5f1c0d1e-7a2b-4c3d-9e8f-0a1b2c3d4e5f"
GPU_UUID = "GPU-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"
VGPU_UUID = "a1b2c3d4-e5f6-4a5b-8c9d-0e1f2a3b4c5d"


def _v6hex(addr: str) -> str:
    return ipaddress.IPv6Address(addr).exploded.replace(":", "")


def _route_hex(addr: str) -> str:
    return f"{struct.unpack('=I', socket.inet_aton(addr))[0]:08x}"


def _dsn_bytes(text: str) -> bytes:
    return int(text.replace("-", ""), 16).to_bytes(8, "little")


# Every secret of the host, in every encoding it could be written in: the category-8 cases.
SECRETS: dict[str, list[str | bytes]] = {
    "MAC": [
        MAC,
        MAC.replace(":", ""),
        MAC.replace(":", "-"),
        "5254.0012.3456",
        "50:54:00:ff:fe:12:34:56",  # EUI-64
        "5054:ff:fe12:3456",
        "5054:00ff:fe12:3456",
        "505400fffe123456",
        "52-54-00-ff-ff-12-34-56",  # a NIC's PCIe Device Serial Number
        bytes.fromhex("525400123456"),
        bytes.fromhex("505400fffe123456"),
        _dsn_bytes("52-54-00-ff-ff-12-34-56"),
    ],
    "hostname": [HOST, "secret--host--name", "secret_host_name"],
    "user": ["alice"],
    "kernel command line": ["hunter2", "s3cr3t", ROOT_UUID],
    "serial numbers": [
        "ABC123",  # lspci VPD
        "MT1234X56789",
        "DMISERIAL123",
        "BOARDSERIAL456",
        "CHASSIS789",
        "4c4c4544-0042-3510-8052-b4c04f4e3232",  # product_uuid
        "1654321098765",  # GPU serial_number
        "1323456789012",  # nvidia-smi <serial>
        "699-2g500-0202-400",  # board part number
        "s4ewnx0r123456",  # NVMe serial
        "cafef00d",  # ARM cpuinfo Serial
        GPU_UUID[4:],
        "fe-dc-ba-98-76-54-32-10",  # the GPU's Device Serial Number, as lspci prints it
        _dsn_bytes("fe-dc-ba-98-76-54-32-10"),  # and in config space
    ],
    "machine ids": ["8f3b2c1d9e8f7a6b5c4d3e2f1a0b9c8d", "d6a0f3e2-1b2c-4d5e-8f90-a1b2c3d4e5f6"],
    "VM": ["secret-vm-name", VGPU_UUID],
    "IPv4": [V4, V4_GW, V4_USB, "85.214.132.9", _route_hex(V4), _route_hex("85.214.132.0"), _route_hex(V4_GW)],
    "IPv6": [
        V6_EUI,
        V6_PRIV,
        "2a01:4f8:1:2",
        _v6hex(V6_EUI),
        _v6hex(V6_PRIV),
        _v6hex("2a01:4f8:1:2::")[:16],
        "9c3d:1a2b:3c4d:5e6f",
        "9c3d1a2b3c4d5e6f",
    ],
}

NVIDIA_SMI_XML = f"""<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">
<nvidia_smi_log>
  <timestamp>Sat Nov 21 20:17:59 2026</timestamp>
  <driver_version>580.159.04</driver_version>
  <cuda_version>13.0</cuda_version>
  <attached_gpus>1</attached_gpus>
  <gpu id="00000000:41:00.0">
    <product_name>NVIDIA A100 80GB PCIe</product_name>
    <product_architecture>Ampere</product_architecture>
    <mig_mode><current_mig>Disabled</current_mig><pending_mig>Disabled</pending_mig></mig_mode>
    <mig_devices>None</mig_devices>
    <serial>1323456789012</serial>
    <uuid>{GPU_UUID}</uuid>
    <board_part_number>699-2G500-0202-400</board_part_number>
    <platformInfo><chassis_serial_number>CHASSIS789</chassis_serial_number></platformInfo>
    <gpu_virtualization_mode><virtualization_mode>Host VGPU</virtualization_mode></gpu_virtualization_mode>
    <pci>
      <pci_bus_id>00000000:41:00.0</pci_bus_id>
      <pci_gpu_link_info>
        <pcie_gen><max_link_gen>4</max_link_gen><current_link_gen>4</current_link_gen>
          <max_device_link_gen>4</max_device_link_gen></pcie_gen>
        <link_widths><max_link_width>16x</max_link_width><current_link_width>16x</current_link_width></link_widths>
      </pci_gpu_link_info>
    </pci>
    <fb_memory_usage><total>81920 MiB</total><reserved>512 MiB</reserved></fb_memory_usage>
    <vgpu_instances>
      <vgpu_instance id="3251634213">
        <vm_id>{VGPU_UUID}</vm_id>
        <vm_name>secret-vm-name</vm_name>
        <vgpu_instance_uuid>{VGPU_UUID}</vgpu_instance_uuid>
        <guest_info><hostname>{HOST}</hostname><ip_address>{V4}</ip_address></guest_info>
      </vgpu_instance>
    </vgpu_instances>
  </gpu>
</nvidia_smi_log>
"""

LSPCI_VVV = """0000:42:00.0 Ethernet controller [0200]: Mellanox Technologies MT27800 Family [15b3:1017]
\tSubsystem: Mellanox Technologies Stand-up ConnectX-5 [15b3:0008]
\tCapabilities: [48] Vital Product Data
\t\tProduct Name: CX556A - ConnectX-5 QSFP28
\t\tRead-only fields:
\t\t\t[PN] Part number: MCX556A-ECAT
\t\t\t[EC] Engineering changes: A9
\t\t\t[SN] Serial number: MT1234X56789
\t\t\t[V0] Vendor specific: PCIeGen3 x16
\t\t\t[RV] Reserved: checksum good, 2 byte(s) reserved
\t\tRead/write fields:
\t\t\t[V1] Vendor specific: ABC123
\t\tEnd
\tCapabilities: [100 v1] Device Serial Number 52-54-00-ff-ff-12-34-56
\tKernel driver in use: mlx5_core

0000:41:00.0 3D controller [0302]: NVIDIA Corporation GA100 [A100 PCIe 80GB] [10de:20b5] (rev a1)
\tCapabilities: [bb0 v1] Device Serial Number fe-dc-ba-98-76-54-32-10
\tKernel driver in use: nvidia
"""


def _fake_commands(bindir: Path) -> None:
    bindir.mkdir()
    scripts = {
        # uname answers what it is asked, -n (the hostname) included.
        "uname": f"""#!/bin/sh
[ $# -eq 0 ] && set -- -s
for a in "$@"; do case $a in
  -a) printf 'Linux {HOST} 6.1.0-test #1 SMP PREEMPT_DYNAMIC x86_64 GNU/Linux ';;
  -s) printf 'Linux ';; -n) printf '{HOST} ';; -r) printf '6.1.0-test ';;
  -v) printf '#1 SMP PREEMPT_DYNAMIC ';; -m) printf 'x86_64 ';;
esac; done; echo
""",
        "lspci": f"""#!/bin/sh
case "$*" in *-vvv*) cat <<'EOF'
{LSPCI_VVV}EOF
;; *) echo '0000:41:00.0 3D controller [0302]: NVIDIA Corporation GA100 [10de:20b5]';; esac
""",
        "nvidia-smi": f"#!/bin/sh\ncat <<'EOF'\n{NVIDIA_SMI_XML}EOF\n",
    }
    for name, text in scripts.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)


def _if_inet6(addr: str, index: int, plen: int, scope: int, name: str) -> str:
    return f"{_v6hex(addr)} {index:02x} {plen:02x} {scope:02x} 80 {name:>8}\n"


def _v6_route(dest: str, plen: int, gw: str, flags: int, name: str) -> str:
    zero = "0" * 32
    return f"{_v6hex(dest)} {plen:02x} {zero} 00 {_v6hex(gw)} 00000100 00000001 00000000 {flags:08x} {name:>8}\n"


def secret_host(root: Path) -> FakeHost:
    """A host whose every identifying value is one of SECRETS."""
    fake = FakeHost(root)
    fake.cmdline = (
        f"BOOT_IMAGE=/vmlinuz-6.1.0 root=UUID={ROOT_UUID} ro password=hunter2 intel_iommu=on iommu=pt "
        "fbcon=map:0 -- initsecret=s3cr3t"
    )
    fake.write("proc/version", f"Linux version 6.1.0-test (alice@{HOST}) (gcc 12.2.0) #1 SMP PREEMPT_DYNAMIC\n")
    fake.write(
        "proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vmx\nSerial\t\t: cafef00d\n\n"
    )
    fake.write("etc/os-release", f'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nBUILD_ID="{HOST}"\n')
    for rel, text in {
        "etc/hostname": HOST,
        "proc/sys/kernel/hostname": HOST,
        "etc/machine-id": "8f3b2c1d9e8f7a6b5c4d3e2f1a0b9c8d",
        "proc/sys/kernel/random/boot_id": "d6a0f3e2-1b2c-4d5e-8f90-a1b2c3d4e5f6",
        "sys/class/dmi/id/product_serial": "DMISERIAL123",
        "sys/class/dmi/id/product_uuid": "4c4c4544-0042-3510-8052-b4c04f4e3232",
        "sys/class/dmi/id/board_serial": "BOARDSERIAL456",
        "sys/class/dmi/id/chassis_serial": "CHASSIS789",
        "proc/net/arp": f"IP address HW type Flags HW address Mask Device\n{V4_GW} 0x1 0x2 {MAC} * eth0\n",
    }.items():
        fake.write(rel, text + "\n")

    gpu = fake.pci(GPU, cls=0x030200, device=0x20B5, driver="nvidia", group=5)
    fake.write(f"{gpu}/serial_number", "1654321098765\n")
    config = bytearray(4096)
    config[0x100:0x104] = (0x0003 | (1 << 16)).to_bytes(4, "little")
    config[0x104:0x10C] = _dsn_bytes("fe-dc-ba-98-76-54-32-10")
    fake.write(f"{gpu}/config", bytes(config))
    fake.write(f"proc/driver/nvidia/gpus/{GPU}/information", f"Model: A100\nGPU UUID: {GPU_UUID}\nDevice Minor: 0\n")
    fake.open_file(4242, "qemu-system-x86", "/dev/vfio/5")
    fake.write("proc/4242/cmdline", "qemu-system-x86_64\0-name\0guest=secret-vm-name\0")
    fake.write("proc/4242/environ", "PASSWORD=hunter2\0")
    fake.write(  # the configured kernel arguments: captured for the dry run, scrubbed as /proc/cmdline
        "etc/default/grub",
        f"GRUB_DEFAULT=0\nGRUB_PASSWORD=s3cr3t\n# {HOST}\n"
        f'GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on password=hunter2 root=UUID={ROOT_UUID}"\n',
    )

    nic = fake.pci(NIC, cls=0x020000, vendor=0x15B3, device=0x1017, driver="mlx5_core", group=6)
    config[0x104:0x10C] = _dsn_bytes("52-54-00-ff-ff-12-34-56")
    fake.write(f"{nic}/config", bytes(config))
    fake.net("eth0", NIC, ipv4=V4, gateway=V4_GW)
    fake.net(USB_NIC, None, ipv4=V4_USB)
    for name in ("eth0", USB_NIC):
        base = (root / "sys/class/net" / name).resolve()
        for attr in ("address", "perm_addr"):
            (base / attr).write_text(MAC + "\n")
        (base / "phys_switch_id").write_text(MAC.replace(":", "") + "\n")
    fake.write(
        "proc/net/if_inet6",
        _if_inet6(V6_EUI, 2, 64, 0, "eth0")
        + _if_inet6(V6_PRIV, 2, 64, 0, "eth0")
        + _if_inet6(V6_LINK, 2, 64, 0x20, "eth0")
        + _if_inet6("::1", 1, 128, 0x10, "lo"),
    )
    fake.write(
        "proc/net/ipv6_route",
        _v6_route("2a01:4f8:1:2::", 64, "::", 0x1, "eth0")
        + _v6_route("::", 0, "fe80::1", 0x3, "eth0")
        + _v6_route(V6_EUI, 128, "::", 0x80200001, "eth0")
        + _v6_route(V6_LINK, 128, "::", 0x80200001, "eth0")
        + _v6_route("ff00::", 8, "::", 0x1, "eth0"),
    )

    fake.pci(NVME, cls=0x010802, vendor=0x144D, device=0xA808, driver="nvme", group=7)
    fake.block("nvme0n1", NVME, partitions=("nvme0n1p1", "nvme0n1p2"))
    disk = (root / "sys/class/block/nvme0n1").resolve()
    for attr, value in (("serial", "S4EWNX0R123456"), ("wwid", "eui.0025388s4ewnx0r123456"), ("eui", "s4ewnx0r")):
        (disk / attr).write_text(value + "\n")
    for dm, lv in (("dm-0", "root"), ("dm-1", "swap_1")):
        fake.block(dm, None)
        fake.write(f"sys/devices/virtual/block/{dm}/dm/name", f"secret--host--name--vg-{lv}\n")
        fake.link(f"sys/devices/virtual/block/{dm}/slaves/nvme0n1p2", "sys/class/block/nvme0n1p2")
    fake.mount("/dev/mapper/secret--host--name--vg-root", "/")
    fake.mount("/dev/nvme0n1p1", "/boot/efi")
    fake.mount(f"nfs.{HOST}.example:/export/alice", "/srv/nfs")
    fake.mount("//fileserver/alice", "/mnt/share")
    fake.swap("/dev/mapper/secret--host--name--vg-swap_1")
    fake.swap("/home/alice/swapfile")
    fake.finish()
    # Mount options that carry secrets, as the kernel shows them.
    mounts = (root / "proc/mounts").read_text()
    mounts = mounts.replace("/mnt/share ext4 rw", "/mnt/share cifs rw,username=alice,password=hunter2")
    (root / "proc/mounts").write_text(mounts.replace("/srv/nfs ext4 rw", "/srv/nfs nfs4 rw,addr=85.214.132.9"))
    return fake


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fake live root, its capture), captured with the fake commands on PATH."""
    tmp = tmp_path_factory.mktemp("privacy")
    secret_host(tmp / "root")
    _fake_commands(tmp / "bin")
    out = tmp / "capture.tar.gz"
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp / 'bin'}{os.pathsep}{path}"
    try:
        capture(str(out), str(tmp / "root"), _commands_on_any_root=True)
    finally:
        os.environ["PATH"] = path
    return tmp / "root", out


CASES = [(kind, s) for kind, secrets in SECRETS.items() for s in secrets]


@pytest.mark.parametrize(("kind", "secret"), CASES, ids=[f"{k}:{s!r}" for k, s in CASES])
def test_no_secret_in_any_encoding(kind: str, secret: str | bytes, captured) -> None:
    _, out = captured
    # The whole tar stream: member names, link targets and every member's content.
    data = gzip.decompress(out.read_bytes())
    needle = secret if isinstance(secret, bytes) else secret.lower().encode()
    haystack = data if isinstance(secret, bytes) else data.lower()
    at = haystack.find(needle)
    assert at < 0, f"{kind} {secret!r} found: ...{data[max(0, at - 200) : at + 60]!r}"


def test_the_commands_were_captured_without_what_identifies(captured) -> None:
    _, out = captured
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        uname = tar.extractfile("capture/uname").read().decode()  # type: ignore[union-attr]
        vvv = tar.extractfile("capture/lspci-vvv").read().decode()  # type: ignore[union-attr]
        smi = tar.extractfile("capture/nvidia-smi-q-x").read().decode()  # type: ignore[union-attr]
        cmdline = tar.extractfile("proc/cmdline").read().decode()  # type: ignore[union-attr]
    assert {"capture/lspci-nnk", "capture/lspci-vvv", "capture/nvidia-smi-q-x", "capture/uname"} <= names
    assert uname.split() == ["Linux", "6.1.0-test", "#1", "SMP", "PREEMPT_DYNAMIC", "x86_64"]
    assert "Vital Product Data (left out)" in vvv and "Kernel driver in use: mlx5_core" in vvv
    assert "<product_name>NVIDIA A100 80GB PCIe</product_name>" in smi and "vgpu_instance" not in smi
    assert cmdline == "intel_iommu=on iommu=pt fbcon=map:0\n"
    with tarfile.open(out) as tar:
        grub = tar.extractfile("etc/default/grub").read().decode()  # type: ignore[union-attr]
    assert grub == 'GRUB_DEFAULT="0"\nGRUB_CMDLINE_LINUX_DEFAULT="intel_iommu=on"\n', grub
    private = ("address", "perm_addr", "phys_switch_id", "serial", "serial_number", "wwid", "eui", "cmdline", "environ")
    # A holder's command line is kept as the digest of its guest name alone (issue #50).
    assert not [n for n in names if n.rsplit("/", 1)[-1] in private and n not in ("proc/cmdline", "proc/4242/cmdline")]
    with tarfile.open(out) as tar:
        holder = tar.extractfile("proc/4242/cmdline").read()  # type: ignore[union-attr]
    assert holder == b"qemu-system-x86\0-name\0guest=" + guest_digest("secret-vm-name").encode() + b"\0"
    assert not [n for n in names if n.startswith(("etc/hostname", "etc/machine-id", "sys/class/dmi", "proc/sys/"))]


def _report(argv: list[str], capsys) -> dict:
    assert main(argv) in (0, 1)
    return json.loads(capsys.readouterr().out)


_ADDRESS = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b|\b[0-9a-f]{4}(?::[0-9a-f]{4}){7}\b")


def _comparable(report: dict) -> dict:
    """A report less what the capture rewrites on purpose: cmdline, IP numbers, MAC-named NICs, and the
    name of the VM whose QEMU holds a device (the live host reads it from QEMU's command line, which a
    capture leaves out)."""
    report = json.loads(json.dumps(report))
    report["host"].pop("root")
    report["iommu"].pop("cmdline")
    for held in report["host_needs"].get("open_device_files", []):
        held["guest"] = None
    text = _ADDRESS.sub("<ip>", json.dumps(report))
    text = re.sub(r", guest [^)\"]*", "", text)
    return json.loads(re.sub(r"\benx[0-9a-f]{12}\b", "enx<n>", text))


def test_inspect_reads_the_capture_back_to_the_same_verdicts(captured, tmp_path, capsys) -> None:
    root, out = captured
    live = _report(["inspect", "--json", "--root", str(root)], capsys)
    again = _report(["inspect", "--json", "--root", str(out)], capsys)
    comparable = _comparable(again), _comparable(live)
    assert [(g["address"], g["ready"], g["findings"]) for g in comparable[0]["gpus"]] == [
        (g["address"], g["ready"], g["findings"]) for g in comparable[1]["gpus"]
    ]
    assert comparable[0] == comparable[1]
    assert "secret-vm-name" not in json.dumps(again)
    nets = {n["name"]: n for n in again["host_needs"]["net"]}
    assert "default (IPv6)" in nets["eth0"]["routes"] and len(nets["eth0"]["addresses"]) == 3
    assert [r for r in nets["eth0"]["routes"] if r.startswith("default via 198.51.100.")]
    assert USB_NIC not in nets and len(nets["enx000000000001"]["addresses"]) == 1
    blocks = {b["name"]: b["uses"] for b in again["host_needs"]["block"]}
    assert blocks["dm-0"] == ["mounted at /"] and blocks["dm-1"] == ["swap"]
    assert blocks["nvme0n1p1"] == ["mounted at /boot/efi"]
    assert again["iommu"]["args"] == live["iommu"]["args"] == {"intel_iommu": "on", "iommu": "pt"}
    verify = _report(["verify", "--json", "--root", str(out)], capsys)
    assert verify["gpus"][0]["name"] == "NVIDIA A100 80GB PCIe"
    assert verify["gpus"][0]["virtualization_mode"] == "host-vgpu"


# ---------------------------------------------------------------- the rewrites, one by one


def _smi_samples(host_root) -> list[str]:
    xmls = [NVIDIA_SMI_XML]
    for name in ("h100-live", "h200-live", "h100-passthrough-guest"):  # the captures with the real XML
        xmls.append((host_root(name) / "capture" / "nvidia-smi-q-x").read_text())
    h100 = xmls[-1]
    xmls.append(as_vgpu(h100, "GRID A100-4C", 4096, license="Licensed (Expiry: 2027-1-1 0:0:0 GMT)"))
    mig = h100.replace("<current_mig>Disabled", "<current_mig>Enabled")
    xmls.append(mig.replace("<mig_devices>", "<mig_devices><mig_device><index>0</index></mig_device><mig_device/>"))
    xmls.append(mig)  # MIG on, no instance yet
    return xmls


def test_the_smi_allowlist_keeps_everything_verify_reads(host_root) -> None:
    samples = _smi_samples(host_root)
    assert len(samples) >= 7
    for xml in samples:
        kept = smi_xml(xml)
        assert kept is not None and len(kept) < len(xml)
        assert parse_smi_xml(kept) == parse_smi_xml(zero_ids(xml))  # GPU UUIDs are zeroed on purpose


@pytest.mark.parametrize("text", ["not xml", "<other/>", ""])
def test_output_that_is_not_smi_xml_is_left_out(text: str) -> None:
    assert smi_xml(text) is None


@pytest.mark.parametrize(
    ("cmdline", "kept"),
    [
        ("root=/dev/nvme0n1p2 ro quiet", "root=/dev/nvme0n1p2"),
        ("root=UUID=abcd root=PARTUUID=x root=/dev/mapper/host--vg-root", ""),
        ("vfio-pci.ids=10de:2330 kvm.ignore_msrs=1 nvidia-drm.modeset=1 rd.driver.pre=vfio-pci", None),
        ("amd_iommu=on iommu.passthrough=1 pcie_acs_override=downstream video=efifb:off", None),
        ("hugepagesz=1G hugepages=16 default_hugepagesz=1G isolcpus=2-15 console=ttyS0,115200", None),
        ("password=hunter2 ip=10.0.0.5::10.0.0.1:255.255.255.0:myhost:eth0:off secret", ""),
        ("intel_iommu=on -- intel_iommu=off --token s3cr3t", "intel_iommu=on"),
    ],
)
def test_the_kernel_arguments_kept(cmdline: str, kept: str | None) -> None:
    assert kernel_cmdline(cmdline) == (cmdline if kept is None else kept) + "\n"


def test_lspci_keeps_all_but_vpd_and_serials() -> None:
    text = lspci_verbose(LSPCI_VVV)
    assert "MT1234X56789" not in text and "ABC123" not in text and "[PN]" not in text
    assert "Device Serial Number 00-00-00-00-00-00-00-00" in text
    assert text.count("Kernel driver in use:") == 2 and "Subsystem: Mellanox" in text


def _owners(root: Path) -> list[str | None]:
    """The NIC that owns each of the host's addresses, in fib_trie's order."""
    order = re.findall(r"\|-- (\S+)\n\s+/32 host LOCAL", (root / "proc/net/fib_trie").read_text())
    if not order:  # a capture keeps fib_trie under the capturing process's proc/<pid>/net
        (trie,) = root.glob("proc/*/net/fib_trie") or root.glob("proc/net/fib_trie")
        order = re.findall(r"\|-- (\S+)\n\s+/32 host LOCAL", trie.read_text())
    nets = read_usage(Sysfs(str(root))).net.values()
    return [next((n.name for n in nets if a in n.addresses), None) for a in dict.fromkeys(order)]


_network = st.tuples(st.integers(1 << 24, (224 << 24) - 1), st.integers(8, 30)).filter(lambda t: t[0] >> 24 != 127)


@given(nets=st.lists(_network, min_size=1, max_size=5), default=st.booleans())
def test_renumbered_routes_still_match_their_addresses(nets, default, tmp_path_factory) -> None:
    """Which NIC owns which address (the longest connected route that covers it) and which
    has the default route survive the renumbering, whatever the prefixes and their overlaps."""
    tmp = tmp_path_factory.mktemp("net")
    fake = FakeHost(tmp / "live")
    for i, (address, prefix) in enumerate(nets):
        ip = socket.inet_ntoa(struct.pack("!I", address))
        fake.net(f"eth{i}", None, ipv4=ip, prefix=prefix, gateway="10.255.255.254" if default and i == 0 else None)
    fake.finish()
    out = tmp / "c.tar.gz"
    capture(str(out), str(tmp / "live"))
    (tmp / "x").mkdir()
    unpack(str(out), str(tmp / "x"))
    assert _owners(tmp / "x") == _owners(tmp / "live")
    defaults = [
        {n.name for n in read_usage(Sysfs(str(r))).net.values() if n.carries_default_route}
        for r in (tmp / "x", tmp / "live")
    ]
    assert defaults[0] == defaults[1] == ({"eth0"} if default else set())


_HEX_TOKEN = st.sampled_from([2, 8, 32]).flatmap(lambda n: st.text("0123456789abcdefF", min_size=n, max_size=n))
_TOKEN = st.one_of(_HEX_TOKEN, st.sampled_from(["eth0", "lo", "|--", "/32", "host", "LOCAL", "-1", "0x1f"]), st.text())
_NET_TEXT = st.lists(st.lists(_TOKEN, max_size=12).map(" ".join), max_size=8).map("\n".join)


@given(route=_NET_TEXT, trie=_NET_TEXT, inet6=_NET_TEXT, route6=_NET_TEXT)
def test_garbled_net_files_are_rewritten_without_error(route, trie, inet6, route6) -> None:
    """A capture of a damaged root: rows the readers would skip are dropped, nothing raises."""
    members = {
        "proc/net/route": ("file", route.encode()),
        "proc/net/fib_trie": ("file", trie.encode()),
        "proc/net/if_inet6": ("file", inet6.encode()),
        "proc/net/ipv6_route": ("file", route6.encode()),
    }
    out = scrub_members(members, set())
    assert set(out) == set(members)
    for _, payload in out.values():
        assert isinstance(payload, bytes)
