"""The multi-GPU, large-BAR domain (tests/plan/test_domain_multigpu.py) defined by a real libvirtd,
and the QEMU command line libvirt makes for it: OVMF's MMIO window (``-fw_cfg
name=opt/ovmf/X-PciMmio64Mb``), a ``pxb-pcie`` per guest NUMA cell with the GPUs' root ports
on it, and ``x-nv-gpudirect-clique`` on every NVLink GPU's vfio-pci device.

The libvirtd is a private, unprivileged one (``qemu:///session`` of user nobody when run as
root), with its own sockets and files in a temporary folder and a binary name of its own:
nothing of the machine's libvirtd (or of tests/ansible/test_gpu_vms_libvirt.py's) is touched. About
a second. What this machine cannot give a session daemon is set in the XML before it is
defined: TCG (no KVM), both guest cells on host node 0 (one node here), no pinning, and
``<driver name='vfio'/>`` on the hostdevs (no IOMMU here, so libvirt cannot pick vfio itself;
on a GPU host its default is vfio).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuprov.core.vm_spec import HostSettings
from gpuprov.plan.vm.domain import domain_xml
from gpuprov.plan.vm.domain_compare import compare_domain_xml, diff_text
from gpuprov.plan.vm.fit import plan_host
from gpuprov.plan.vm.plan import domain_config
from tests.vmhosts import HGX_GPUS, hgx_two_node_host

pytestmark = pytest.mark.slow

LIBVIRTD = shutil.which("libvirtd") or "/usr/sbin/libvirtd"
VIRSH = shutil.which("virsh")


def _user_env(base: Path) -> dict[str, str]:
    home = base / "home"
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(base / "run"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }


def _as_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "nobody", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture
def libvirt_dir() -> Iterator[Path]:
    """The daemon's files, where user nobody can reach them (pytest's tmp_path is root's only)."""
    top = Path(tempfile.gettempdir())
    closed = [p for p in (top, *top.parents) if not p.stat().st_mode & stat.S_IXOTH]
    assert os.geteuid() != 0 or not closed, f"nobody cannot enter {closed[0]}: make TMPDIR a folder others can enter"
    base = Path(tempfile.mkdtemp(prefix="gpuprov-libvirt-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def virsh(libvirt_dir: Path) -> Iterator[list[str]]:
    assert VIRSH and os.path.exists(LIBVIRTD), "libvirt is missing: scripts/bootstrap.sh test installs it"
    base = libvirt_dir
    for sub in ("home", "run"):
        (base / sub).mkdir(parents=True)
    daemon = base / "gpuprov-test-libvirtd"  # a name of its own: pgrep -x libvirtd does not see it
    shutil.copy2(LIBVIRTD, daemon)
    if os.geteuid() == 0:
        for sub in ("home", "run"):
            shutil.chown(base / sub, "nobody")
        (base / "run").chmod(0o700)
    env = _user_env(base)
    proc = subprocess.Popen(_as_user(["env", *[f"{k}={v}" for k, v in env.items()], str(daemon), "--timeout=120"]))
    socket = base / "run" / "libvirt" / "libvirt-sock"
    deadline = time.monotonic() + 30
    while not socket.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the test's libvirtd did not start"
        time.sleep(0.1)
    try:
        yield _as_user(["env", *[f"{k}={v}" for k, v in env.items()], VIRSH, "-q", "-c", "qemu:///session"])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_libvirt_makes_the_qemu_command_line_for_the_multi_gpu_domain(tmp_path, libvirt_dir, virsh) -> None:
    facts = hgx_two_node_host(tmp_path / "root")
    vm = {"name": "big", "vcpus": 4, "memory_mib": 1024, "gpus": list(HGX_GPUS), "nvlink_clique": True, "network": None}
    plan = plan_host(facts, [{**vm, "accel": "tcg", "pin": False}], HostSettings())
    assert not plan.refusals, plan.refusals
    cfg = domain_config(plan.vm("big"), plan.placements["big"], {})
    assert [c.host_node for c in cfg.numa_cells] == [0, 1]
    for cell in cfg.numa_cells:
        cell.host_node = 0  # this machine's only node
    xml = domain_xml(cfg).replace("<source>", "<driver name='vfio' /><source>")
    path = libvirt_dir / "big.xml"
    path.write_text(xml)
    path.chmod(0o644)
    define = subprocess.run([*virsh, "define", str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert define.returncode == 0, define.stderr + xml
    # Idempotent against libvirt's own rendering: the next run does not redefine it.
    live = subprocess.run(
        [*virsh, "dumpxml", "--inactive", "big"], capture_output=True, text=True, timeout=120, check=True
    )
    same, before, after = compare_domain_xml(xml, live.stdout)
    assert same, diff_text(before, after, "big")
    argv = subprocess.run(
        [*virsh, "domxml-to-native", "qemu-argv", "--domain", "big"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert argv.returncode == 0, argv.stderr
    line = argv.stdout
    assert "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576" in line  # 4 x 128 GiB BARs -> 1 TiB
    assert line.count('"driver":"pxb-pcie"') == 2
    assert '"numa_node":0' in line and '"numa_node":1' in line
    assert "-numa node,nodeid=0,cpus=0-1" in line and "-numa node,nodeid=1,cpus=2-3" in line
    for i, address in enumerate(HGX_GPUS):
        assert f'"host":"{address}","id":"ua-gpu{i}"' in line, line
    assert line.count('"x-nv-gpudirect-clique":0') == 4
    # Each GPU's root port sits on its cell's expander bus (pci.1: cell 0, pci.2: cell 1).
    assert line.count('"driver":"pcie-root-port","port":0,"chassis":3,"id":"pci.3","bus":"pci.1"') == 1
    assert '"id":"pci.5","bus":"pci.2"' in line
