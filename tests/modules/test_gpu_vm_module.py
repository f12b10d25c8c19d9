"""The gpu_vm module, run for real by ansible (AnsiballZ) on a target interpreter
with neither gpuprov nor ansible: against libvirt's test driver (``test:///FILE``,
whose state is the file's). GPU domains take their host facts from captured
hosts (a staged root: the seed files land below it, commands are only listed in
``not_run``); real storage (qemu-img overlay, genisoimage seed) is made on the
live root in a temp dir, for VMs without devices. The real qemu:///system run is
tests/ansible/test_gpu_vms_libvirt.py; hostile options are tests/inputs/test_inputs.py."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import tree_digest
from tests.modules.test_modules import run_module
from tests.vmhosts import ssh_public_key

NETWORK = """<network><name>default</name><bridge name='virbr0'/>
<ip address='192.168.122.1' netmask='255.255.255.0'/></network>"""
OTHER = """<domain type='qemu'><name>other</name><memory unit='KiB'>262144</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='q35'>hvm</type></os><devices>
<hostdev mode='subsystem' type='pci' managed='yes'>
<source><address domain='0x0000' bus='0x01' slot='0x00' function='0x1'/></source></hostdev>
</devices></domain>"""


def _target(tmp_path_factory: pytest.TempPathFactory, with_libvirt: bool) -> str:
    venv = tmp_path_factory.mktemp("target-libvirt" if with_libvirt else "target-bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    if with_libvirt:
        import libvirt  # the test extra installs libvirt-python

        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        source = Path(libvirt.__file__).parent
        for path in [source / "libvirt.py", *source.glob("libvirtmod.*.so")]:
            shutil.copy2(path, site)
    for package in ("gpuprov", "ansible"):
        probe = subprocess.run([python, "-c", f"import {package}"], capture_output=True, cwd="/", check=False)
        assert probe.returncode != 0, f"the target interpreter must not have {package}"
    return python


@pytest.fixture(scope="module")
def libvirt_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A target Python with the libvirt bindings only (as python3-libvirt gives a real host)."""
    return _target(tmp_path_factory, with_libvirt=True)


@pytest.fixture(scope="module")
def bare_target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _target(tmp_path_factory, with_libvirt=False)


def node(tmp_path: Path, *domains: str, network: bool = True) -> str:
    """A test-driver URI whose host has these domains (running) and the default network."""
    path = tmp_path / f"node-{len(list(tmp_path.glob('node-*')))}.xml"
    path.write_text("<node>" + (NETWORK if network else "") + "".join(domains) + "</node>")
    return f"test://{path}"


@pytest.fixture
def storage(tmp_path: Path) -> dict[str, str]:
    base = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "64M"], check=True)
    return {"base": str(base), "dir": str(tmp_path / "vms")}


def vm(storage: dict[str, str], **kw) -> dict:
    return {
        "name": "vm1",
        "memory_mib": 256,
        "accel": "tcg",
        "firmware": "bios",
        "network": "default",
        "disk": {"base": storage["base"], "size_gib": 1},
        "cloud_init": {"user": "gpuadmin", "ssh_authorized_keys": [ssh_public_key("test@example")]},
        **kw,
    }


def args(storage: dict[str, str], uri: str, root: Path, **kw) -> dict:
    return {"uri": uri, "storage_dir": storage["dir"], "root": str(root), "reserved_memory_mib": 0, **kw}


def as_test_driver_domain(xml: str) -> str:
    """The module's XML, as the test driver keeps it (no uuid needed)."""
    return ET.tostring(ET.fromstring(xml), encoding="unicode")


def test_without_libvirt_bindings_the_module_names_the_package(bare_target, host_root, tmp_path) -> None:
    result = run_module(bare_target, "gpu_vm", {"vm": {"name": "x"}, "uri": "test:///default"})
    assert result["failed"]
    assert "python3-libvirt" in result["msg"] and "libvirt-python" in result["msg"]


@pytest.fixture
def staged(host_root, tmp_path, storage) -> Path:
    """The gpu-audio capture, copied: a staged root the module may write its files below,
    with the base image where the VM names it (the host's files are the root's)."""
    dest = tmp_path / "staged"
    shutil.copytree(host_root("gpu-audio"), dest, symlinks=True)
    base = dest / storage["base"].lstrip("/")
    base.parent.mkdir(parents=True)
    shutil.copy2(storage["base"], base)
    return dest


def test_check_mode_then_define_then_idempotent_then_a_change(libvirt_python, staged, storage, tmp_path) -> None:
    """A GPU domain over a captured host: defined in the test driver, idempotent; the storage
    commands are the captured host's to run, so only listed, and the seed files land below the root."""
    root = staged
    spec = vm(storage, gpus=["0000:01:00.0"])
    dry = run_module(
        libvirt_python, "gpu_vm", {"vm": spec, "state": "defined", **args(storage, node(tmp_path), root)}, check=True
    )
    assert not dry["failed"], dry.get("msg")
    assert dry["changed"] is True and not os.path.exists(storage["dir"])
    assert "would define domain vm1 (new)" in dry["plan"]
    assert "+++ after: libvirt domain vm1" in dry["stdout"] and "multifunction" in dry["stdout"]
    assert f"+++ after: {root}{storage['dir']}/vm1-seed/user-data" in dry["stdout"]
    assert dry["placement"]["pci_slots"] == [["0000:01:00.0", "0000:01:00.1"]]

    first = run_module(
        libvirt_python, "gpu_vm", {"vm": spec, "state": "defined", **args(storage, node(tmp_path), root)}
    )
    assert not first["failed"], first.get("msg")
    assert first["changed"] is True and first["done"][-1] == "define domain vm1 (new)"
    assert any("qemu-img create" in s for s in first["not_run"])
    assert any("cidata" in s for s in first["not_run"])  # the seed ISO
    assert not os.path.exists(storage["dir"])  # nothing on this machine
    assert "#cloud-config" in Path(f"{root}{storage['dir']}/vm1-seed/user-data").read_text()

    # The test driver forgets between calls: a host that has the domain as defined.
    defined = node(tmp_path, as_test_driver_domain(first["xml"]))
    before = tree_digest(root)
    again = run_module(libvirt_python, "gpu_vm", {"vm": spec, "state": "defined", **args(storage, defined, root)})
    assert not again["failed"], again.get("msg")
    assert again["changed"] is False and tree_digest(root) == before
    assert again["plan"] == again["not_run"]  # only the commands left to the captured host

    changed = run_module(
        libvirt_python,
        "gpu_vm",
        {"vm": {**spec, "memory_mib": 512}, "state": "defined", **args(storage, defined, root)},
    )
    assert not changed["failed"], changed.get("msg")
    assert changed["changed"] is True and changed["done"] == ["define domain vm1 (its definition differs)"]
    assert changed["needs_restart"] is True
    assert '-  <memory unit="KiB">262144</memory>' in changed["stdout"]
    assert '+  <memory unit="KiB">524288</memory>' in changed["stdout"]


def test_storage_on_the_live_root_then_idempotent(libvirt_python, storage, tmp_path) -> None:
    """On / (a VM without devices), the overlay and seed ISO are made for real, once."""
    spec = vm(storage)
    first = run_module(libvirt_python, "gpu_vm", {"vm": spec, "state": "defined", **args(storage, node(tmp_path), "/")})
    assert not first["failed"], first.get("msg")
    assert first["changed"] is True and first["not_run"] == []
    info = json.loads(
        subprocess.run(
            ["qemu-img", "info", "--output=json", f"{storage['dir']}/vm1.qcow2"], capture_output=True, check=True
        ).stdout
    )
    assert info["backing-filename"] == storage["base"] and info["virtual-size"] == 1 << 30
    assert os.path.getsize(f"{storage['dir']}/vm1-seed.iso") > 0
    assert "#cloud-config" in Path(f"{storage['dir']}/vm1-seed/user-data").read_text()
    defined = node(tmp_path, as_test_driver_domain(first["xml"]))
    before = tree_digest(Path(storage["dir"]))
    again = run_module(libvirt_python, "gpu_vm", {"vm": spec, "state": "defined", **args(storage, defined, "/")})
    assert not again["failed"], again.get("msg")
    assert again["changed"] is False and again["plan"] == [] and tree_digest(Path(storage["dir"])) == before


def test_a_device_held_by_another_domain_is_refused(libvirt_python, host_root, storage, tmp_path) -> None:
    uri = node(tmp_path, OTHER)
    result = run_module(
        libvirt_python,
        "gpu_vm",
        {"vm": vm(storage, gpus=["0000:01:00.0"]), **args(storage, uri, host_root("gpu-audio"))},
    )
    assert result["failed"] and result["msg"].startswith("refused, nothing changed: ")
    assert "VM vm1: 0000:01:00.1 is already assigned to domain other (running)" in result["msg"]
    assert not os.path.exists(storage["dir"])


@pytest.mark.parametrize(
    ("host", "bridge", "text"),
    [
        ("gpu-alone", "0000:00:01.0", "PCIe root or switch port"),
        ("gpu-bridge-nic", "0000:01:00.0", "PCI-to-PCI bridge"),
    ],
)
def test_a_bridge_is_refused(libvirt_python, host_root, storage, tmp_path, host, bridge, text) -> None:
    """Bridges and ports are never passable (docs/concepts/safety-rules.md); the refusal names the device below."""
    uri = node(tmp_path)
    before = tree_digest(tmp_path)
    result = run_module(
        libvirt_python, "gpu_vm", {"vm": vm(storage, gpus=[bridge]), **args(storage, uri, host_root(host))}
    )
    assert result["failed"] and result["msg"].startswith("refused, nothing changed: ")
    assert f"{bridge} is a {text}" in result["msg"] and "pass the device below it instead" in result["msg"]
    assert tree_digest(tmp_path) == before


def test_the_whole_host_list_is_checked_first(libvirt_python, host_root, storage, tmp_path) -> None:
    spec = vm(storage)
    hog = {"name": "hog", "memory_mib": 100000, "pin": False}
    result = run_module(
        libvirt_python,
        "gpu_vm",
        {"vm": spec, "host_vms": [spec, hog], **args(storage, node(tmp_path), host_root("gpu-audio"))},
    )
    assert result["failed"] and "host memory oversubscribed" in result["msg"]
    assert not os.path.exists(storage["dir"])


def test_defaults_merge_under_the_vm(libvirt_python, staged, storage, tmp_path) -> None:
    spec = vm(storage, cloud_init={"hostname": "trainer"})
    defaults = {"cloud_init": {"user": "ops", "ssh_authorized_keys": [ssh_public_key("ops")]}, "vcpus": 1}
    result = run_module(
        libvirt_python,
        "gpu_vm",
        {"vm": spec, "defaults": defaults, "state": "defined", **args(storage, node(tmp_path), staged)},
        check=True,
    )
    assert not result["failed"], result.get("msg")
    assert result["guest_user"] == "ops" and '"hostname": "trainer"' in result["stdout"]


def test_running_and_a_missing_network(libvirt_python, staged, storage, tmp_path) -> None:
    root = staged
    started = run_module(libvirt_python, "gpu_vm", {"vm": vm(storage), **args(storage, node(tmp_path), root)})
    assert not started["failed"], started.get("msg")
    assert started["done"][-2:] == ["define domain vm1 (new)", "start domain vm1 (state running)"]
    missing = run_module(
        libvirt_python, "gpu_vm", {"vm": vm(storage), **args(storage, node(tmp_path, network=False), root)}
    )
    assert missing["failed"] and "VM vm1: libvirt network default does not exist" in missing["msg"]


def test_absent_undefines_and_removes_what_it_made(libvirt_python, storage, tmp_path) -> None:
    root = "/"  # storage is made and removed for real on the live root
    first = run_module(
        libvirt_python, "gpu_vm", {"vm": vm(storage), "state": "defined", **args(storage, node(tmp_path), root)}
    )
    uri = node(tmp_path, as_test_driver_domain(first["xml"]))
    spec = {"vm": vm(storage), "state": "absent", "remove_storage": True, **args(storage, uri, root)}
    dry = run_module(libvirt_python, "gpu_vm", spec, check=True)
    assert dry["changed"] and dry["plan"][:2] == [
        "would destroy domain vm1 (state absent: power off)",
        "would undefine domain vm1 (state absent)",
    ]
    # --diff shows the runtime steps as Ansible renders them, not only with -v.
    assert "+++ after: libvirt domain vm1 (now): state absent: power off\n" in dry["stdout"]
    assert "\n+destroy domain vm1\n" in dry["stdout"] and "\n+undefine domain vm1\n" in dry["stdout"]
    assert os.path.exists(f"{storage['dir']}/vm1.qcow2")
    gone = run_module(libvirt_python, "gpu_vm", spec)
    assert gone["changed"] and not glob.glob(f"{storage['dir']}/vm1*")
    assert os.path.exists(storage["base"])  # the base image is never touched
    nothing = run_module(libvirt_python, "gpu_vm", {**spec, "uri": node(tmp_path)})
    assert nothing["changed"] is False


class _Network:
    def __init__(self, table: list[tuple[str, int]]) -> None:
        self.table = table

    def DHCPLeases(self, mac: str) -> list[dict]:
        return [{"ipaddr": ip, "expirytime": exp, "type": 0, "mac": mac} for ip, exp in self.table]


class _Conn:
    def __init__(self, table: list[tuple[str, int]]) -> None:
        self.net = _Network(table)

    def networkLookupByName(self, name: str) -> _Network:
        return self.net


def test_address_is_the_newest_lease_not_a_stale_one() -> None:
    from gpuprov.apply.libvirt import wait_for_address
    from gpuprov.facts.libvirt import leases

    mac = "52:54:00:4f:ab:d6"
    old = [("192.168.213.92", 1000), ("192.168.213.93", 2000)]  # earlier guests under the same MAC
    conn = _Conn(old)
    assert leases(conn, "net", mac) == [("192.168.213.93", 2000), ("192.168.213.92", 1000)]
    assert wait_for_address(conn, "net", mac, 0, stale=old) == []  # nothing new yet
    conn.net.table = [*old, ("192.168.213.94", 1500)]
    assert wait_for_address(conn, "net", mac, 0, stale=old) == ["192.168.213.94"]
    conn.net.table = [("192.168.213.92", 1000), ("192.168.213.93", 5000)]  # the same guest renewed its lease
    assert wait_for_address(conn, "net", mac, 0, stale=old) == ["192.168.213.93"]
    assert wait_for_address(conn, "net", mac, 0) == ["192.168.213.93", "192.168.213.92"]  # running before: newest
