"""Fail closed (docs/concepts/safety-rules.md): evidence a safety rule needs that is
missing, looping or garbled is "unknown", and unknown is never ready, in inspect, its
--require-ready gate, its JSON, the vfio planner and the vGPU planner. Each case starts
from a real capture (tests/fixtures/hosts) and takes one piece of evidence away.
Bridges, root ports and host bridges are never passable, in every command and module."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gpuprov.apply.actions import ApplyError, apply
from gpuprov.cli.main import main
from gpuprov.core.vm_spec import HostSettings
from gpuprov.facts.files import read_text
from gpuprov.facts.host import HostFacts, gather
from gpuprov.facts.libvirt import LiveDomain
from gpuprov.facts.sysfs import Sysfs
from gpuprov.facts.vm_storage import StorageState
from gpuprov.plan.host.vfio import MANAGED_FILES, UDEV_RULES, VfioRequest, plan_vfio, udev_rules
from gpuprov.plan.vm.fit import plan_host
from gpuprov.plan.vm.plan import VmOptions, plan_vm
from gpuprov.report.inspect import build_report
from gpuprov.rules.assess import assess_gpu
from tests.conftest import captured_hosts, tree_digest
from tests.fakehost import FakeHost

Mutation = Callable[[Path], None]

# ------------------------------------------------------------------ editing a copied capture


def at(root: Path, rel: str) -> Path:
    """``rel`` below ``root`` with the links on the way followed (proc/net -> proc/self/net -> ...),
    the last component itself not: removing a link removes the link."""
    parent, _, name = rel.rpartition("/")
    real_parent = Path(os.path.realpath(root / parent))
    assert real_parent == root or root in real_parent.parents, rel
    return real_parent / name


def remove(rel: str) -> Mutation:
    def run(root: Path) -> None:
        path = at(root, rel)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()

    return run


def write(rel: str, text: str, *, append: bool = False) -> Mutation:
    def run(root: Path) -> None:
        path = at(root, rel)
        before = path.read_text() if append else ""
        path.unlink(missing_ok=True)
        path.write_text(before + text)

    return run


def relink(rel: str, target: str | None = None) -> Mutation:
    """Point link ``rel`` at ``target``; None: at itself (a loop)."""

    def run(root: Path) -> None:
        path = at(root, rel)
        path.unlink()
        path.symlink_to(target or path.name)

    return run


def file_instead(rel: str) -> Mutation:
    """A regular file where a directory was: listing it fails."""

    def run(root: Path) -> None:
        path = at(root, rel)
        shutil.rmtree(path)
        path.write_text("not a directory\n")

    return run


def both(*mutations: Mutation) -> Mutation:
    def run(root: Path) -> None:
        for mutation in mutations:
            mutation(root)

    return run


def open_file(pid: int, target: str) -> Mutation:
    def run(root: Path) -> None:
        (root / f"proc/{pid}/fd").mkdir(parents=True)
        (root / f"proc/{pid}/comm").write_text("qemu-system-x86\n")
        (root / f"proc/{pid}/fd/3").symlink_to(target)

    return run


def holder_fd(action: Callable[[Path], None]) -> Mutation:
    """Apply ``action`` to the fd directory of the process the capture holds (vfio-bound's sleep)."""

    def run(root: Path) -> None:
        (fd_dir,) = [p for p in (root / "proc").glob("[0-9]*/fd")]
        action(fd_dir)

    return run


def _rm_tree(path: Path) -> None:
    shutil.rmtree(path)


def _file_for_dir(path: Path) -> None:
    shutil.rmtree(path)
    path.write_text("x\n")


def no_class(address: str) -> Mutation:
    """The device's class unreadable: no PCI_CLASS in its uevent, no class file."""

    def run(root: Path) -> None:
        uevent = at(root, f"sys/bus/pci/devices/{address}/uevent")
        text = "".join(line for line in uevent.read_text().splitlines(True) if not line.startswith("PCI_CLASS"))
        uevent.unlink()
        uevent.write_text(text)
        at(root, f"sys/bus/pci/devices/{address}/class").unlink()

    return run


# ------------------------------------------------------------------ the hostile cases

EDU_ALONE = ("gpu-alone", "0000:01:00.0")  # ready as captured
EDU_NIC = ("gpu-bridge-nic", "0000:02:01.0")  # shares group 5 with the default-route NIC 02:02.0
EDU_SWAP = ("nvme-swap", "0000:03:00.0")  # shares group 3 with NVMe 04:00.0: swap + a mount
BOOT_VGA = ("boot-vga", "0000:00:02.0")
SECOND_VGA = ("boot-vga", "0000:02:00.0")  # ready as captured
HELD = ("vfio-bound", "0000:01:00.0")
NIC = "0000:02:02.0"
NIC_LINK = f"sys/bus/pci/devices/{NIC}/iommu_group"
ROUTE_GARBAGE = "eth1\tGARBAGE\n"

# (id, (host, device), mutation, evidence named in the finding); ids are grouped by evidence kind.
CASES: list[tuple[str, tuple[str, str], Mutation, str]] = [
    # IOMMU groups and group links
    ("groups/dir-gone", EDU_NIC, remove("sys/kernel/iommu_groups"), "IOMMU groups"),
    ("groups/dir-gone-lone-gpu", EDU_ALONE, remove("sys/kernel/iommu_groups"), "IOMMU groups"),
    ("groups/dir-is-a-file", EDU_NIC, file_instead("sys/kernel/iommu_groups"), "IOMMU groups"),
    ("groups/nic-link-gone", EDU_NIC, remove(NIC_LINK), "members of IOMMU group 5"),
    ("groups/nic-link-loops", EDU_NIC, relink(NIC_LINK), "members of IOMMU group 5"),
    ("groups/nic-link-garbage", EDU_NIC, relink(NIC_LINK, "../../../not/a/group"), "members of IOMMU group 5"),
    ("groups/nic-link-unlisted", EDU_NIC, relink(NIC_LINK, "../../../../kernel/iommu_groups/99"), "members of"),
    ("groups/group-dir-gone", EDU_NIC, remove("sys/kernel/iommu_groups/5"), "IOMMU group of 0000:02:01.0"),
    ("groups/own-link-loops", EDU_ALONE, relink("sys/bus/pci/devices/0000:01:00.0/iommu_group"), "IOMMU group of"),
    (
        "groups/other-link-gone-lone-gpu",
        EDU_ALONE,
        remove("sys/bus/pci/devices/0000:02:00.0/iommu_group"),
        "members of IOMMU group 6",
    ),
    ("groups/nic-not-in-pci-listing", EDU_NIC, remove(f"sys/bus/pci/devices/{NIC}"), f"PCI device {NIC}"),
    ("groups/own-link-gone", EDU_ALONE, remove("sys/bus/pci/devices/0000:01:00.0/iommu_group"), "iommu_group"),
    # storage: block devices, mounts, swap, holders
    ("storage/swaps-gone", EDU_SWAP, remove("proc/swaps"), "swap list"),
    ("storage/mounts-gone", EDU_SWAP, remove("proc/mounts"), "mount table"),
    ("storage/swaps-and-mounts-gone", EDU_SWAP, both(remove("proc/swaps"), remove("proc/mounts")), "mount table"),
    ("storage/swaps-gone-lone-gpu", EDU_ALONE, remove("proc/swaps"), "swap list"),
    ("storage/swaps-header-garbage", EDU_SWAP, write("proc/swaps", "garbage\n"), "swap list"),
    ("storage/swaps-line-garbage", EDU_SWAP, write("proc/swaps", "/dev/x\n", append=True), "swap list"),
    ("storage/mounts-line-garbage", EDU_SWAP, write("proc/mounts", "\x00\xff junk\n", append=True), "mount table"),
    ("storage/mounts-empty-file-is-fine-but-swap-not", EDU_SWAP, write("proc/swaps", ""), "swap list"),
    ("storage/class-block-gone", EDU_SWAP, remove("sys/class/block"), "block devices"),
    ("storage/class-block-gone-lone-gpu", EDU_ALONE, remove("sys/class/block"), "block devices"),
    ("storage/partition-link-loops", EDU_SWAP, relink("sys/class/block/nvme1n1p2"), "block device nvme1n1p2"),
    ("storage/holders-gone", EDU_SWAP, remove("sys/class/block/nvme1n1/holders"), "holders of nvme1n1"),
    (
        "storage/mount-of-an-unknown-disk",
        EDU_ALONE,
        write("proc/mounts", "/dev/sdz1 /data ext4 rw 0 0\n", append=True),
        "the disk behind /dev/sdz1",
    ),
    # network: interfaces, routes, addresses
    ("network/route-gone", EDU_NIC, remove("proc/net/route"), "IPv4 routes"),
    ("network/route-gone-lone-gpu", EDU_ALONE, remove("proc/net/route"), "IPv4 routes"),
    ("network/route-line-garbage", EDU_NIC, write("proc/net/route", ROUTE_GARBAGE, append=True), "IPv4 routes"),
    ("network/route-header-garbage", EDU_NIC, write("proc/net/route", "nonsense\n"), "IPv4 routes"),
    ("network/fib-trie-garbage", EDU_NIC, write("proc/net/fib_trie", "Main:\n  ??? 10.0.2.15\n"), "IPv4 addresses"),
    (
        "network/fib-trie-bad-address",
        EDU_NIC,
        write("proc/net/fib_trie", "Main:\n     |-- 999.0.2.15\n        /32 host LOCAL\n"),
        "IPv4 addresses",
    ),
    ("network/fib-trie-gone", EDU_NIC, remove("proc/net/fib_trie"), "IPv4 addresses"),
    ("network/if-inet6-gone", EDU_NIC, remove("proc/net/if_inet6"), "IPv6 addresses"),
    ("network/if-inet6-garbage", EDU_NIC, write("proc/net/if_inet6", "zz 1 2 3\n"), "IPv6 addresses"),
    ("network/ipv6-route-gone", EDU_NIC, remove("proc/net/ipv6_route"), "IPv6 routes"),
    ("network/ipv6-route-garbage", EDU_NIC, write("proc/net/ipv6_route", "::/0 eth0\n"), "IPv6 routes"),
    ("network/class-net-gone", EDU_NIC, remove("sys/class/net"), "network interfaces"),
    ("network/nic-link-loops", EDU_NIC, relink("sys/class/net/eth0"), "network interface eth0"),
    ("network/nic-link-gone", EDU_NIC, remove("sys/class/net/eth0"), "network interface eth0"),
    # display: boot_vga, console, the command line that maps it
    ("display/boot-vga-gone", BOOT_VGA, remove("sys/bus/pci/devices/0000:00:02.0/boot_vga"), "boot_vga of"),
    ("display/boot-vga-garbage", BOOT_VGA, write("sys/bus/pci/devices/0000:00:02.0/boot_vga", "x\n"), "boot_vga of"),
    ("display/cmdline-gone", EDU_ALONE, remove("proc/cmdline"), "kernel command line"),
    ("display/fb-device-loops", SECOND_VGA, relink("sys/class/graphics/fb0/device"), "framebuffer fb0"),
    # chipset: a group member's class
    ("chipset/member-class-unreadable", EDU_NIC, no_class(NIC), f"class of {NIC}"),
    # in use: open device files
    ("in-use/fd-dir-gone", HELD, holder_fd(_rm_tree), "open device files"),
    ("in-use/fd-dir-is-a-file", HELD, holder_fd(_file_for_dir), "open device files"),
    ("in-use/unknown-drm-card", EDU_ALONE, open_file(4242, "/dev/dri/card7"), "the device behind /dev/dri/card7"),
    ("in-use/unknown-nvidia-minor", EDU_ALONE, open_file(4242, "/dev/nvidia3"), "the device behind /dev/nvidia3"),
    ("in-use/unknown-vfio-group", EDU_ALONE, open_file(4242, "/dev/vfio/99"), "the device behind /dev/vfio/99"),
]


@pytest.fixture
def mutated(host_root, tmp_path) -> Callable[[str, Mutation | None], Path]:
    def make(host: str, mutation: Mutation | None) -> Path:
        root = tmp_path / host
        shutil.copytree(host_root(host), root, symlinks=True)
        if mutation is not None:
            mutation(root)
        return root

    return make


def blocker_text(facts: HostFacts, device: str) -> str:
    return "\n".join(f.message for f in assess_gpu(facts, device).blockers)


@pytest.mark.parametrize(("host_device", "mutation", "evidence"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_missing_evidence_is_never_ready(mutated, capsys, host_device, mutation, evidence) -> None:
    host, device = host_device
    root = mutated(host, mutation)
    facts = gather(Sysfs(str(root)))
    gpu = assess_gpu(facts, device)
    assert not gpu.ready
    assert evidence in blocker_text(facts, device)
    unknown = [f for f in gpu.blockers if f.code == "unknown"]
    assert all(f.fix for f in unknown)
    if evidence != "iommu_group":  # the device's own link gone: "no IOMMU group", named by path
        assert any(evidence in f.message for f in unknown), blocker_text(facts, device)
        listed = [m["evidence"] for m in build_report(facts, [gpu])["host_needs"]["missing_evidence"]]
        assert any(evidence in name or name in evidence for name in listed), listed

    # The gate: exit 3, and stderr says why.
    assert main(["inspect", "--root", str(root), "--device", device, "--require-ready", device]) == 3
    err = capsys.readouterr().err
    assert f"not ready: {device}" in err and evidence in err

    # The vfio planner refuses and changes nothing.
    before = tree_digest(root)
    sysfs = Sysfs(str(root))
    files = {p: read_text(sysfs, p) for p in MANAGED_FILES}
    plan = plan_vfio(gather(sysfs), VfioRequest(devices=[device]), files)
    assert plan.refused and not plan.actions
    assert evidence in plan.refusal_text()
    with pytest.raises(ApplyError, match="refused, nothing changed"):
        apply(plan, str(root))
    assert tree_digest(root) == before


def test_each_evidence_kind_has_cases() -> None:
    kinds = {c[0].split("/")[0] for c in CASES}
    assert kinds == {"groups", "storage", "network", "display", "chipset", "in-use"}


@pytest.mark.parametrize(
    ("host_device", "ready"),
    [
        (EDU_ALONE, True),
        (SECOND_VGA, True),
        (("gpu-switch", "0000:03:00.0"), True),
        (EDU_NIC, False),
        (EDU_SWAP, False),
    ],
)
def test_unaltered_captures_keep_their_verdicts(host_root, host_device, ready) -> None:
    host, device = host_device
    facts = gather(Sysfs(str(host_root(host))))
    gpu = assess_gpu(facts, device)
    assert gpu.ready is ready
    assert not [f for f in gpu.findings if f.code == "unknown"]


@pytest.mark.parametrize(
    "name", [n for n in captured_hosts() if n not in ("ci-host-no-iommu", "h100-passthrough-guest")]
)
def test_unaltered_captures_miss_no_evidence(host_root, name) -> None:
    assert gather(Sysfs(str(host_root(name)))).missing == {}


def test_older_captures_name_what_they_lack(host_root) -> None:
    """Captured before gpuprov read swaps and routes: IOMMU off anyway, and now also unknown."""
    missing = gather(Sysfs(str(host_root("h100-passthrough-guest")))).missing
    assert {"swap list", "IPv4 routes", "IPv4 addresses"} <= set(missing)
    assert missing["swap list"].path == "/proc/swaps" and missing["swap list"].problem == "absent"


def test_ipv6_disabled_at_boot_needs_no_ipv6_tables(mutated) -> None:
    root = mutated(
        "gpu-alone",
        both(
            remove("proc/net/if_inet6"),
            remove("proc/net/ipv6_route"),
            write("proc/cmdline", "console=ttyS0 intel_iommu=on iommu=pt ipv6.disable=1\n"),
        ),
    )
    facts = gather(Sysfs(str(root)))
    assert facts.missing == {} and assess_gpu(facts, EDU_ALONE[1]).ready


def test_unreadable_numa_memory_refuses_the_vm_plan(mutated) -> None:
    root = mutated("gpu-audio", remove("sys/devices/system/node/node0/meminfo"))
    plan = plan_host(gather(Sysfs(str(root))), [{"name": "a", "memory_mib": 128}], HostSettings(reserved_memory_mib=0))
    assert any("unknown: host memory could not be read" in r.message for r in plan.refusals), plan.refusals


# ------------------------------------------------------------------ bridges, root ports, host bridges

# (host, bridge, what it is, the fix names the endpoint(s) to pass instead)
BRIDGES = [
    ("gpu-alone", "0000:00:01.0", "PCIe root or switch port", "pass the device below it instead: 0000:01:00.0"),
    (
        "gpu-bridge-nic",
        "0000:01:00.0",
        "PCI-to-PCI bridge",
        "pass the device below it instead: 0000:02:01.0, 0000:02:02.0",
    ),
    ("gpu-alone", "0000:00:00.0", "host bridge", "pass an endpoint device instead"),
    ("gpu-switch", "0000:01:00.0", "PCIe root or switch port", "instead: 0000:03:00.0, 0000:04:00.0"),
    ("gpu-switch", "0000:02:00.0", "PCIe root or switch port", "instead: 0000:03:00.0"),
    ("boot-vga", "0000:00:1f.0", "ISA bridge", "pass an endpoint device instead (the GPU itself): 0000:00:02.0"),
]
BRIDGE_IDS = [f"{h}-{a[5:]}" for h, a, _, _ in BRIDGES]


@pytest.mark.parametrize(("host", "bridge", "kind", "fix"), BRIDGES, ids=BRIDGE_IDS)
def test_a_bridge_is_never_ready(host_root, capsys, host, bridge, kind, fix) -> None:
    root = str(host_root(host))
    gpu = assess_gpu(gather(Sysfs(root)), bridge)
    (finding,) = [f for f in gpu.blockers if f.code == "bridge"]
    assert f"{bridge} is a {kind}" in finding.message and "never passed through" in finding.message
    assert fix in (finding.fix or "")
    assert main(["inspect", "--root", root, "--require-ready", bridge]) == 3
    err = capsys.readouterr().err
    assert f"{bridge} is a {kind}" in err and fix in err


@pytest.mark.parametrize(("host", "bridge", "kind", "fix"), BRIDGES, ids=BRIDGE_IDS)
def test_vfio_planner_refuses_a_bridge_even_with_allow_unsafe(mutated, host, bridge, kind, fix) -> None:
    root = mutated(host, None)
    before = tree_digest(root)
    sysfs = Sysfs(str(root))
    files = {p: read_text(sysfs, p) for p in MANAGED_FILES}
    plan = plan_vfio(gather(sysfs), VfioRequest(devices=[bridge], allow_unsafe=[bridge]), files)
    assert plan.refused and not plan.actions
    (refusal,) = [r for r in plan.refusals if "never passed through" in r.message]
    assert "(allow_unsafe does not lift this)" in refusal.message and fix in (refusal.fix or "")
    assert not any("never passed through" in w for w in plan.warnings)
    with pytest.raises(ApplyError, match="refused, nothing changed"):
        apply(plan, str(root))
    assert tree_digest(root) == before


@pytest.mark.parametrize(("host", "bridge", "kind", "fix"), BRIDGES, ids=BRIDGE_IDS)
def test_plan_refuses_a_vm_given_a_bridge(host_root, tmp_path, capsys, host, bridge, kind, fix) -> None:
    host_vars = tmp_path / "host_vars.yml"
    doc = {"gpu_vms_reserved_memory_mib": 0, "gpu_vms_list": [{"name": "vm1", "memory_mib": 128, "gpus": [bridge]}]}
    host_vars.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(host_vars), "--root", str(host_root(host)), "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    (refusal,) = [r for r in report["refusals"] if f"{bridge} is a {kind}" in r["message"]]
    assert refusal["message"].startswith(f"VM vm1: {bridge} is not vfio-ready") and fix in refusal["fix"]


@pytest.mark.parametrize(("host", "bridge", "kind", "fix"), BRIDGES, ids=BRIDGE_IDS)
def test_gpu_vm_planning_refuses_a_bridge(host_root, host, bridge, kind, fix) -> None:
    facts = gather(Sysfs(str(host_root(host))))
    spec = {"name": "vm1", "memory_mib": 128, "gpus": [bridge]}
    host_plan = plan_host(facts, [spec], HostSettings(reserved_memory_mib=0))
    plan = plan_vm(facts, host_plan, "vm1", LiveDomain(), {}, StorageState(), VmOptions(state="defined"))
    assert plan.refused  # gpu_vm's finish_vm carries out nothing of a refused plan (module test below)
    assert f"{bridge} is a {kind}" in plan.refusal_text()


def test_a_bridge_in_the_gpus_group_stays_with_pcieport(mutated) -> None:
    root = mutated("gpu-switch", None)
    sysfs = Sysfs(str(root))
    plan = plan_vfio(gather(sysfs), VfioRequest(devices=["0000:03:00.0"]), {p: None for p in MANAGED_FILES})
    assert not plan.refused, plan.refusal_text()
    assert plan.bind_set == ["0000:03:00.0"]
    port = "0000:02:00.0"  # the downstream port in group 7 with the edu
    assert not [a for a in plan.actions if (a.path or "").endswith(f"{port}/driver_override")]
    assert not [a for a in plan.actions if a.content == port or "pcieport" in (a.path or "")]
    assert port not in "".join(a.content or "" for a in plan.actions if a.path == UDEV_RULES)


def test_a_bridge_left_in_the_udev_rule_by_an_older_version_is_dropped(mutated) -> None:
    root = mutated("gpu-alone", None)
    files: dict[str, str | None] = {p: None for p in MANAGED_FILES}
    files[UDEV_RULES] = udev_rules(["0000:00:01.0"])
    plan = plan_vfio(gather(Sysfs(str(root))), VfioRequest(devices=["0000:01:00.0"]), files)
    assert not plan.refused
    (rule,) = [a for a in plan.actions if a.path == UDEV_RULES]
    assert '"0000:01:00.0"' in (rule.content or "") and "0000:00:01.0" not in (rule.content or "")
    assert any("0000:00:01.0 is a bridge or port: dropped" in w for w in plan.warnings)


@pytest.mark.parametrize(
    ("cls", "driver", "kind"),
    [(0x088000, "pcieport", "PCIe root or switch port"), (0x0B4000, None, "devices sit on a bus below it")],
    ids=["pcieport-driver", "has-child-bus"],
)
def test_a_port_or_bridge_by_driver_or_children_whatever_its_class(tmp_path, cls, driver, kind) -> None:
    fake = FakeHost(tmp_path / "root")
    fake.pci("0000:40:01.0", cls=cls, driver=driver, group=4)
    fake.pci("0000:41:00.0", cls=0x030200, driver="nvidia", group=5, parent="0000:40:01.0")
    facts = gather(Sysfs(str(fake.finish())))
    (finding,) = [f for f in assess_gpu(facts, "0000:40:01.0").blockers if f.code == "bridge"]
    assert kind in finding.message and "0000:41:00.0" in (finding.fix or "")
    assert assess_gpu(facts, "0000:41:00.0").ready


def test_giving_a_device_back_while_its_users_are_unknown_is_refused(mutated) -> None:
    """state: unbound only asks whether something holds the device; unknown counts as held."""
    root = mutated(HELD[0], holder_fd(_rm_tree))
    before = tree_digest(root)
    plan = plan_vfio(gather(Sysfs(str(root))), VfioRequest(devices=[HELD[1]], state="unbound"), {})
    assert plan.refused and not plan.actions
    assert "unknown: open device files could not be read" in plan.refusal_text()
    assert tree_digest(root) == before
