"""Role gpu_vms and module gpu_vm against a real libvirtd (qemu:///system), for real.

The test setup makes a network namespace of its own (``gpuprov-libvirt``), starts
virtlogd, and libvirtd inside that namespace, defines an isolated libvirt network
(``gpuprov-test``, bridge ``gpvirbr0``, DHCP on 192.168.213.0/24, no forwarding)
and builds the guest image with ``scripts/guest-image.sh`` (Debian 12 + cloud-init,
cached under ``${GPUPROV_CACHE:-~/.cache/gpuprov}/guest/``). libvirtd's bridge,
dnsmasq and the guests' taps are all in that namespace, and so are ansible-playbook
and ssh (``ip netns exec``): every packet stays between this test and its guest,
never on the machine's own network.

Then, through ``ansible-playbook`` and the role, as an admin would run it:

1. a VM with no GPU (TCG: ``accel: tcg``, direct kernel boot from the image's own
   kernel, a qcow2 overlay, a cloud-init seed with a user and an SSH key) is
   defined and started; the role waits for its DHCP lease and SSH and adds it to
   ``gpu_guests``; the next play logs in to it over SSH as that user;
2. the same run again reports ``changed=0`` (and still logs in); then module gpu_host_drain
   drains it for a host change (issue #30 item 4: a clean ACPI shutdown, waited for, and the
   drain record) and restores it, and the role's next run finds it as it was (``changed=0``, the
   guest's address now, not a lease the MAC held before this boot);
3. ``state: shutdown`` shuts it down (ACPI), again with no change the second time;
4. ``state: absent`` undefines it and removes its overlay and seed;
5. domains with GPUs, mdevs and pinning (devices from captured hosts, defined but
   not started) are idempotent against libvirt's own rendering of them.

Each stage's wall time is printed. Needs root, KVM is not used. Part of the full run.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.ansible.jsonplay import json_playbook_env
from tests.conftest import collections_path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests" / "playbooks" / "gpu-vms-libvirt.yml"
URI = "qemu:///system"
NETWORK = "gpuprov-test"
NETWORK_XML = """<network>
  <name>gpuprov-test</name>
  <bridge name='gpvirbr0' stp='off'/>
  <ip address='192.168.213.1' netmask='255.255.255.0'>
    <dhcp>
      <range start='192.168.213.10' end='192.168.213.250'/>
    </dhcp>
  </ip>
</network>
"""
IMAGES = Path("/var/lib/libvirt/images/gpuprov-test")
# One run at a time on a machine: the domains, network and storage are shared.
LOCK = Path("/run/lock/gpuprov-libvirt-test.lock")
VM = "gpuprov-test-vm"
USER = "gpuadmin"
# Appended to the image's kernel line: under TCG the guest's CPU (libvirt's qemu64, no PCID) would
# have its kernel turn on page-table isolation, and each of its page-table switches (two a system
# call, interrupt or fault) flushes QEMU's software TLB; in an emulator the mitigations protect
# nothing (dev/lab/image.py's GRUB_CMDLINE_LINUX, measured there).
TCG_GUEST_ARGS = "mitigations=off"

# The namespace libvirtd, the guests' network, ansible-playbook and ssh run in.
NETNS = "gpuprov-libvirt"
NETNS_PATH = Path("/run/netns") / NETNS

pytestmark = pytest.mark.slow


def _run(cmd: list[str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"$ {' '.join(cmd)} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _in_netns(cmd: list[str]) -> list[str]:
    return ["ip", "netns", "exec", NETNS, *cmd]


def _ensure_netns() -> None:
    if not NETNS_PATH.exists():
        _run(["ip", "netns", "add", NETNS])
    _run(["ip", "-n", NETNS, "link", "set", "lo", "up"])


def _libvirtd_pid() -> int | None:
    proc = subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True, text=True, check=False)
    pids = proc.stdout.split()
    return int(pids[0]) if pids else None


def _in_our_netns(pid: int) -> bool:
    return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(NETNS_PATH).st_ino


def _stop_socket_activation() -> None:
    """Under systemd, libvirtd.socket would start a libvirtd in the machine's own namespace at
    the first virsh call."""
    if Path("/run/systemd/system").exists():
        units = ["libvirtd.service", "libvirtd.socket", "libvirtd-ro.socket", "libvirtd-admin.socket"]
        subprocess.run(["systemctl", "stop", *units], capture_output=True, timeout=120, check=False)


def _stop_foreign_libvirtd(pid: int) -> None:
    """A libvirtd outside our namespace (e.g. started by the package's unit) would put the
    test network on the machine's own: stop it, unless it runs domains (then refuse)."""
    running = _virsh("list", "--name", check=False).split()
    assert not running, (
        f"libvirtd (pid {pid}) runs outside the test's network namespace with running domains {running}: "
        "stop them and libvirtd (systemctl stop libvirtd), then run the test again"
    )
    _stop_socket_activation()
    if _libvirtd_pid() == pid:
        os.kill(pid, 15)
    deadline = time.monotonic() + 30
    while _libvirtd_pid() is not None:
        assert time.monotonic() < deadline, f"libvirtd (pid {pid}) did not stop within 30 s"
        time.sleep(0.5)


def _virsh(*args: str, check: bool = True) -> str:
    return _run(["virsh", "-q", "-c", URI, *args], check=check).stdout


def _libvirtd_command() -> list[str]:
    """libvirtd, with /dev/kvm hidden from it where there is one: the VMs here are TCG, and on
    machines whose /dev/kvm the QEMU user cannot open (or where KVM hangs) libvirt re-probes QEMU
    on every define, about 70 s each. In a mount namespace of libvirtd's own (the machine's files
    are untouched), a root-only empty file covers /dev/kvm, so libvirt sees no KVM, consistently,
    and a copy of qemu.conf with ``namespaces = []`` stops libvirt from copying that mount into
    each domain's /dev."""
    if not os.path.exists("/dev/kvm") or not shutil.which("unshare"):
        return ["libvirtd", "-d"]
    mask = Path("/run/gpuprov-test-no-kvm")
    mask.touch(mode=0o600)
    conf = Path("/run/gpuprov-test-qemu.conf")
    stock = Path("/etc/libvirt/qemu.conf")
    conf.write_text((stock.read_text() if stock.exists() else "") + "\n# gpuprov tests\nnamespaces = []\n")
    conf.chmod(0o600)
    script = f"mount --bind {mask} /dev/kvm && mount --bind {conf} /etc/libvirt/qemu.conf && exec libvirtd -d"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def _libvirt_has_kvm() -> bool:
    cmd = ["virsh", "-c", URI, "domcapabilities", "--virttype", "kvm"]
    return subprocess.run(cmd, capture_output=True, timeout=120, check=False).returncode == 0


def _libvirtd_answers() -> bool:
    return subprocess.run(["virsh", "-c", URI, "version"], capture_output=True, timeout=30, check=False).returncode == 0


@pytest.fixture(scope="module")
def evidence() -> list[str]:
    return []


@pytest.fixture(scope="module")
def timings(request: pytest.FixtureRequest, evidence: list[str]):
    """Wall time of each stage; printed with the evidence (virsh list, SSH login) after the tests."""
    found: dict[str, float] = {}
    yield found
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n\n=== gpu_vms on a real libvirtd: evidence")
        print("\n".join(evidence))
        print("=== timings (wall, this machine)")
        for stage, seconds in found.items():
            print(f"  {stage:<52} {seconds:7.1f} s")


@pytest.fixture(scope="module")
def machine_lock(timings: dict[str, float]):
    """Wait for any other run of these tests on this machine to finish (30 min at most)."""
    if os.geteuid() != 0:
        pytest.fail("the libvirt test needs root (qemu:///system, the guest image build); CI runs as root")
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(LOCK, "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() - start < 1800, f"another run holds {LOCK} for 30 min"
                time.sleep(2)
        if time.monotonic() - start > 1:
            timings["waiting for another run"] = time.monotonic() - start
        yield
        fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def libvirt_host(
    machine_lock: None, timings: dict[str, float], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """libvirtd answering, the isolated network up, the guest image built, an SSH key."""
    for tool in ("virsh", "libvirtd", "virtlogd", "qemu-system-x86_64", "qemu-img", "genisoimage", "dnsmasq"):
        assert shutil.which(tool), f"{tool} is missing: scripts/bootstrap.sh test installs the libvirt packages"
    start = time.monotonic()
    _ensure_netns()
    pid = _libvirtd_pid()
    if pid is not None and not _in_our_netns(pid):
        _stop_foreign_libvirtd(pid)
    elif pid is None:
        _stop_socket_activation()
    if not _libvirtd_answers():
        if subprocess.run(["pgrep", "-x", "virtlogd"], capture_output=True, check=False).returncode != 0:
            _run(["virtlogd", "-d"])
        if _libvirtd_pid() is None:
            _run(_in_netns(_libvirtd_command()))
        deadline = time.monotonic() + 60
        while not _libvirtd_answers():
            assert time.monotonic() < deadline, "libvirtd did not answer within 60 s"
            time.sleep(1)
    networks = _virsh("net-list", "--all", "--name")
    if NETWORK not in networks.split():
        xml = tmp_path_factory.mktemp("net") / "net.xml"
        xml.write_text(NETWORK_XML)
        _virsh("net-define", str(xml))
    if NETWORK not in _virsh("net-list", "--name").split():
        _virsh("net-start", NETWORK)
    pid = _libvirtd_pid()
    assert pid is not None and _in_our_netns(pid), "libvirtd is not in the test's network namespace"
    bridge = _run(["ip", "-n", NETNS, "-br", "addr", "show", "gpvirbr0"]).stdout
    assert "192.168.213.1/24" in bridge, bridge
    timings["libvirtd + network (own namespace)"] = time.monotonic() - start

    start = time.monotonic()
    proc = _run([str(REPO / "scripts" / "guest-image.sh")], timeout=1800)
    image = Path(proc.stdout.strip().splitlines()[-1])
    timings["guest image (scripts/guest-image.sh)"] = time.monotonic() - start
    # The QEMU user (libvirt-qemu) cannot enter ~root: the base files go under libvirt's images.
    IMAGES.mkdir(parents=True, exist_ok=True)
    for name in ("disk.qcow2", "vmlinuz", "initrd.img"):
        dest = IMAGES / f"base-{name}"
        if dest.exists() and os.path.samefile(dest, image / name):
            continue
        dest.unlink(missing_ok=True)
        try:
            os.link(image / name, dest)
        except OSError:
            shutil.copy2(image / name, dest)
    keydir = tmp_path_factory.mktemp("ssh")
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuprov-test", "-f", str(keydir / "id")])
    return {
        "image": image,
        "key": keydir / "id",
        "pubkey": (keydir / "id.pub").read_text().strip(),
        "cmdline": (image / "cmdline").read_text().strip(),
    }


def _cleanup_domain(name: str) -> None:
    if name in _virsh("list", "--all", "--name", check=False).split():
        _virsh("destroy", name, check=False)
        _virsh("undefine", name, "--nvram", check=False)


@pytest.fixture(scope="module")
def playbook(libvirt_host: dict[str, Any], tmp_path_factory: pytest.TempPathFactory):
    """playbook(state, **role_vars) -> (rc, stats per host, task results, output)."""
    work = tmp_path_factory.mktemp("play")
    inventory = work / "inventory.yml"
    inventory.write_text(
        json.dumps(
            {
                "libvirt_hosts": {
                    "hosts": {
                        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                    }
                }
            }
        )
    )
    vm = {
        "name": VM,
        "memory_mib": 768,
        "vcpus": 1,
        "accel": "tcg",
        "firmware": "bios",
        "network": NETWORK,
        "disk": {"base": str(IMAGES / "base-disk.qcow2"), "size_gib": 8},
        "boot": {
            "kernel": str(IMAGES / "base-vmlinuz"),
            "initrd": str(IMAGES / "base-initrd.img"),
            "cmdline": f"{libvirt_host['cmdline']} {TCG_GUEST_ARGS}",
        },
        "cloud_init": {"user": USER, "ssh_authorized_keys": [libvirt_host["pubkey"]]},
    }
    base_vars = {
        "gpu_vms_list": [vm],
        "gpu_vms_storage_dir": str(IMAGES / "vms"),
        "gpu_vms_wait_timeout": 600,
        "gpu_vms_shutdown_timeout": 240,
        "gpu_vms_guest_ssh_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "gpu_vms_guest_ssh_private_key_file": str(libvirt_host["key"]),
    }

    def run(state: str, **extra: Any) -> tuple[int, dict, list[dict], str]:
        collections_path()  # the role and module come from the checkout's collection (ansible.cfg)
        variables = {**base_vars, "gpu_vms_state": state, **extra}
        (work / "vars.json").write_text(json.dumps(variables))
        cmd = [
            *_in_netns([]),
            str(Path(sys.executable).with_name("ansible-playbook")),
            "-i",
            str(inventory),
            str(PLAYBOOK),
            "-e",
            f"@{work / 'vars.json'}",
        ]
        env = json_playbook_env()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
        output = f"$ {' '.join(cmd)}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
        try:
            data = json.loads(proc.stdout[proc.stdout.index("{") :])
        except ValueError:
            pytest.fail(f"ansible-playbook printed no JSON (rc {proc.returncode}):\n{output}")
        # One entry per host and task, and per item of a loop.
        results = [
            {"task": task["task"]["name"], "host": host, **item}
            for play in data["plays"]
            for task in play["tasks"]
            for host, result in task["hosts"].items()
            for item in (result.get("results") or [result])
        ]
        return proc.returncode, data["stats"], results, output

    yield run
    _cleanup_domain(VM)
    shutil.rmtree(IMAGES / "vms", ignore_errors=True)


def _guest_lines(results: list[dict]) -> list[str]:
    return [r["msg"] for r in results if r["task"] == "Show them" and "msg" in r]


def test_vm_without_gpu_lifecycle_over_ssh(playbook, libvirt_host, timings, evidence) -> None:
    _cleanup_domain(VM)

    start = time.monotonic()
    rc, stats, results, out = playbook("running")
    timings["1. define + start (TCG) + lease + SSH + login"] = time.monotonic() - start
    assert rc == 0, out
    assert stats["localhost"]["changed"] >= 1, out
    (guest,) = [r["guest"] for r in results if r.get("guest")]
    assert _guest_lines(results) == [f"{USER}@{VM} via {guest['address']}"], out
    evidence.append("$ virsh list --all\n" + _run(["virsh", "-c", URI, "list", "--all"]).stdout)
    ssh = [
        "ssh",
        "-i",
        str(libvirt_host["key"]),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        f"{USER}@{guest['address']}",
    ]
    remote = "hostname; id; uname -sr; sudo -n true && echo sudo ok"
    login = _run(_in_netns([*ssh, remote]), timeout=120)
    evidence.append(f"$ ssh -i KEY {USER}@{guest['address']} '{remote}'\n{login.stdout}")
    assert login.stdout.splitlines()[0] == VM and f"({USER})" in login.stdout and "sudo ok" in login.stdout

    start = time.monotonic()
    rc, stats, results, out = playbook("running")
    timings["2. same run again (idempotence)"] = time.monotonic() - start
    assert rc == 0, out
    assert stats["localhost"]["changed"] == 0, out
    assert stats[VM]["changed"] == 0 and stats[VM]["ok"] >= 3, out
    assert _virsh("domstate", VM).strip() == "running"

    # Drained for a change that reboots the host (gpu_host_plan's disruption), as role host_drain
    # runs the module: the guest shut down cleanly (its systemd answers ACPI), recorded, started again.
    # Root / (the module reads the system libvirt only for the host it runs on): its record is this
    # machine's, removed by the restore (and here whatever happens).
    from tests.modrun import run_in_process

    record = Path("/var/lib/gpuprov/drain.json")
    assert not record.exists(), f"{record}: a drain record from elsewhere; restore or remove it first"
    drain = {"uri": URI, "root": "/", "timeout": 240, "vms": [{"name": VM}]}
    try:
        start = time.monotonic()
        drained = run_in_process("gpu_host_drain", {**drain, "disruption": {"reboot": True}})
        timings["2b. drained (clean shutdown, waited for)"] = time.monotonic() - start
        assert not drained["failed"], drained.get("msg")
        assert drained["changed"] and drained["stopped"] == [VM] and not drained.get("forced"), drained
        assert _virsh("domstate", VM).strip() == "shut off" and record.is_file()
        restored = run_in_process("gpu_host_drain", {**drain, "state": "restored"})
        assert not restored["failed"] and restored["started"] == [VM], restored
        assert _virsh("domstate", VM).strip() == "running" and not record.exists()
    finally:
        record.unlink(missing_ok=True)
    # The guest released its lease as it shut down; the role's run waits for the one it takes now.
    start = time.monotonic()
    rc, stats, results, out = playbook("running")
    timings["2c. restored: the role's run (boot back to SSH)"] = time.monotonic() - start
    assert rc == 0 and stats["localhost"]["changed"] == 0, out
    (again,) = [r["guest"] for r in results if r.get("guest")]
    assert _guest_lines(results) == [f"{USER}@{VM} via {again['address']}"], out
    assert _run(_in_netns([*ssh[:-1], f"{USER}@{again['address']}", "hostname"]), timeout=120).stdout.strip() == VM

    start = time.monotonic()
    rc, stats, results, out = playbook("shutdown")
    timings["3. shutdown (ACPI)"] = time.monotonic() - start
    assert rc == 0 and stats["localhost"]["changed"] == 1, out
    assert next(r for r in results if r.get("plan"))["done"][-1].endswith(": shut down"), out
    assert _virsh("domstate", VM).strip() == "shut off"
    listing = _run(["virsh", "-c", URI, "list", "--all"]).stdout
    evidence.append(f"$ virsh list --all   # after state: shutdown\n{listing}")
    rc, stats, _results, out = playbook("shutdown")
    assert rc == 0 and stats["localhost"]["changed"] == 0, out

    start = time.monotonic()
    rc, stats, results, out = playbook("absent", gpu_vms_remove_storage=True)
    timings["4. absent (undefine, remove overlay + seed)"] = time.monotonic() - start
    assert rc == 0 and stats["localhost"]["changed"] == 1, out
    assert VM not in _virsh("list", "--all", "--name").split()
    assert not list((IMAGES / "vms").glob(f"{VM}*"))
    rc, stats, _results, out = playbook("absent", gpu_vms_remove_storage=True)
    assert rc == 0 and stats["localhost"]["changed"] == 0, out


@pytest.mark.parametrize(
    ("capture", "vm"),
    [
        (
            "gpu-audio",
            {"gpus": [{"address": "0000:01:00.0", "rom": "off"}], "hide_kvm": True, "vendor_id": "gpuprov"},
        ),
        ("mtty-mdev", {"mdevs": [{"parent": "mtty", "type": "mtty-1"}, {"parent": "mtty", "type": "mtty-2"}]}),
    ],
)
def test_gpu_domains_are_idempotent_against_libvirt(libvirt_host, host_root, timings, capture, vm, tmp_path) -> None:
    """Defined only (the devices are a captured host's): libvirt's rendering of hostdevs, root ports,
    pinning and UEFI must compare equal to what the builder makes, so a second run changes nothing.
    gpu_vm with a captured root never touches this machine's libvirt (issue 11), so the domain the
    module would define is built from the same planner and defined here with virsh."""
    from gpuprov.core.vm_spec import HostSettings
    from gpuprov.facts.host import gather
    from gpuprov.facts.sysfs import Sysfs
    from gpuprov.plan.vm.domain import build_domain, to_xml
    from gpuprov.plan.vm.domain_compare import compare_domain_xml, diff_text
    from gpuprov.plan.vm.fit import plan_host
    from gpuprov.plan.vm.plan import domain_config, vm_paths

    name = f"gpuprov-test-{capture}"
    _cleanup_domain(name)
    # KVM where libvirt has it (host-passthrough CPU, in-kernel I/O APIC), else TCG: defined, never started.
    accel = "kvm" if _libvirt_has_kvm() else "tcg"
    entry = {"name": name, "memory_mib": 512, "vcpus": 1, "accel": accel, "network": NETWORK, **vm}
    host = plan_host(gather(Sysfs(str(host_root(capture)))), [entry], HostSettings(reserved_memory_mib=0))
    assert not host.refused, host.refusal_text()
    spec = host.vm(name)
    assert spec is not None
    desired = to_xml(build_domain(domain_config(spec, host.placements[name], vm_paths(spec, str(IMAGES / "vms")))))
    path = tmp_path / f"{name}.xml"
    path.write_text(desired)
    try:
        start = time.monotonic()
        _virsh("define", str(path))
        timings[f"5. define {capture} domain (not started)"] = time.monotonic() - start
        live = _virsh("dumpxml", "--inactive", name)
        assert "<hostdev" in live and "pcie-root-port" in live and "<vcpupin" in live
        same, before, after = compare_domain_xml(desired, live)
        assert same, diff_text(before, after, name)
    finally:
        _cleanup_domain(name)
