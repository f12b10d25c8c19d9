"""The drain before a reboot or a rebind (docs/guides/rolling.md): the pure planner (which VMs stop,
what is refused), what the concerns' plans disrupt, the record read back as untrusted input, and
the module gpu_host_drain in process against libvirt's test driver (test:///default: real libvirt
bindings and API, domains that hold PCI devices and mdevs, no QEMU)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuprov.core.plan import WRITE_SYSFS, Action, Refusal
from gpuprov.facts.drain import (
    MAX_RECORD_CHARS,
    MAX_STOPPED,
    RECORD,
    DrainRecord,
    RecordError,
    StoppedDomain,
    parse_record,
    read_record,
    record_text,
)
from gpuprov.facts.libvirt import DomainState
from gpuprov.facts.sysfs import Sysfs
from gpuprov.inputs.vgpu_request import VgpuPlan
from gpuprov.plan.host.boot_trial import BootPlan
from gpuprov.plan.host.drain import (
    Disruption,
    boot_disruption,
    plan_drain,
    plan_restore,
    vfio_disruption,
    vgpu_disruption,
)
from gpuprov.plan.host.vfio import VfioPlan
from tests.modrun import run_in_process

GPU = "0000:41:00.0"
OTHER = "0000:81:00.0"
MDEV = "5a3b1c2d-0000-4000-8000-000000000001"
VF = "0000:41:00.4"
U1, U2, U3 = (f"00000000-0000-4000-8000-00000000000{i}" for i in (1, 2, 3))


def dom(name: str, uuid: str, state: str = "running", devices: list[str] | None = None) -> DomainState:
    return DomainState(name=name, uuid=uuid, state=state, devices=[] if devices is None else devices)


def rebind(*devices: str) -> Disruption:
    return Disruption(devices=list(devices), why=["test: rebinds"])


# ---------------------------------------------------------------- the planner


def test_a_reboot_stops_every_running_vm_and_records_them() -> None:
    domains = [dom("a", U1), dom("b", U2, "shutoff"), dom("c", U3, devices=[GPU])]
    plan = plan_drain(
        domains, Disruption(reboot=True, why=["reboot"]), {"a": "shutdown", "c": "force"}, "refuse", {}, None
    )
    assert not plan.refusals
    assert [d.name for d in plan.stop] == ["a", "c"] and plan.force == ["c"]
    (action,) = plan.actions
    assert action.path == RECORD
    record = parse_record(str(action.content))
    assert [(d.name, d.uuid) for d in record.stopped] == [("a", U1), ("c", U3)]


def test_a_rebind_stops_only_the_vms_holding_the_device_an_mdev_or_a_vf_of_it() -> None:
    domains = [
        dom("whole", U1, devices=[GPU]),
        dom("sliced", U2, devices=[MDEV]),
        dom("vf", "00000000-0000-4000-8000-000000000004", devices=[VF]),
        dom("elsewhere", U3, devices=[OTHER]),
    ]
    parents = {MDEV: VF, VF: GPU}
    policies = {d.name: "shutdown" for d in domains}
    plan = plan_drain(domains, rebind(GPU), policies, "refuse", parents, None)
    assert [d.name for d in plan.stop] == ["whole", "sliced", "vf"]
    assert plan.reasons["sliced"] == f"{GPU} is rebound or re-made"


def test_nothing_disrupted_plans_nothing_and_reads_no_domain() -> None:
    plan = plan_drain([dom("x", U1, "paused")], Disruption(), {}, "refuse", {}, None)
    assert not plan.refusals and not plan.stop and not plan.actions


def test_a_vm_declared_keep_refuses_the_host_naming_it_and_the_fix() -> None:
    domains = [dom("train", U1, devices=[GPU]), dom("infer", U2, devices=[GPU])]
    plan = plan_drain(domains, rebind(GPU), {"train": "keep", "infer": "shutdown"}, "refuse", {}, None)
    (refusal,) = plan.refusals
    assert "VM train is declared drain: keep" in refusal.message and "skipped" in refusal.message
    assert "drain to shutdown" in (refusal.fix or "")
    assert not plan.stop and not plan.actions  # nothing stopped, nothing recorded


def test_an_undeclared_domain_is_refused_unless_allowed() -> None:
    domains = [dom("stranger", U1)]
    refused = plan_drain(domains, Disruption(reboot=True), {}, "refuse", {}, None)
    assert "not declared" in refused.refusals[0].message
    assert "host_drain_undeclared" in (refused.refusals[0].fix or "")
    allowed = plan_drain(domains, Disruption(reboot=True), {}, "shutdown", {}, None)
    assert [d.name for d in allowed.stop] == ["stranger"] and not allowed.force


@pytest.mark.parametrize("state", ["paused", "crashed", "pmsuspended", "nostate", "unknown"])
def test_a_domain_in_a_state_the_drain_cannot_judge_is_refused(state: str) -> None:
    plan = plan_drain([dom("odd", U1, state, [GPU])], rebind(GPU), {"odd": "force"}, "shutdown", {}, None)
    assert plan.refusals and f"is {state}" in plan.refusals[0].message and not plan.stop


def test_a_running_domain_whose_devices_cannot_be_read_is_refused_for_a_rebind() -> None:
    unread = DomainState(name="opaque", uuid=U1, state="running", devices=None)
    plan = plan_drain([unread], rebind(GPU), {"opaque": "shutdown"}, "refuse", {}, None)
    assert "cannot be read" in plan.refusals[0].message and not plan.stop
    # For a reboot it does not matter what it holds: it stops.
    assert [
        d.name for d in plan_drain([unread], Disruption(reboot=True), {"opaque": "shutdown"}, "refuse", {}, None).stop
    ]


def test_a_concern_that_could_not_be_planned_refuses_the_drain() -> None:
    plan = plan_drain(
        [dom("a", U1)], Disruption(unknown=["vfio_bind: not planned (OSError: x)"]), {}, "shutdown", {}, None
    )
    assert "could not be planned (vfio_bind" in plan.refusals[0].message and not plan.stop


def test_a_second_drain_adds_to_the_record_and_an_unchanged_one_writes_nothing() -> None:
    old = DrainRecord(stopped=[StoppedDomain("a", U1)], reason="earlier")
    domains = [dom("a", U1, "shutoff"), dom("b", U2)]
    plan = plan_drain(domains, Disruption(reboot=True, why=["reboot"]), {"b": "shutdown"}, "refuse", {}, old)
    assert [d.uuid for d in parse_record(str(plan.actions[0].content)).stopped] == [U1, U2]
    again = plan_drain([dom("a", U1)], Disruption(reboot=True), {"a": "shutdown"}, "refuse", {}, old)
    assert [d.name for d in again.stop] == ["a"] and not again.actions


def test_a_drain_never_writes_a_record_its_restore_would_refuse() -> None:
    """A record already at the most domains it may hold: one more would be written, then the restore
    would refuse the whole record and start none of the VMs again (issue 49). The drain refuses first."""
    full = DrainRecord(
        stopped=[StoppedDomain(f"vm{i}", f"10000000-0000-4000-8000-{i:012d}") for i in range(MAX_STOPPED)],
        reason="earlier",
    )
    parse_record(record_text(full))  # what is there reads back
    plan = plan_drain([dom("b", U2)], Disruption(reboot=True, why=["reboot"]), {"b": "shutdown"}, "refuse", {}, full)
    assert plan.actions == [] and plan.stop == []
    assert f"{MAX_STOPPED} domains are recorded already and 1 more would stop" in plan.refusals[0].message
    assert plan.refusals[0].fix.startswith("restore the VMs of the earlier drain first")


def test_restore_starts_exactly_the_recorded_shut_off_domains_by_uuid() -> None:
    record = DrainRecord(stopped=[StoppedDomain("a", U1), StoppedDomain("b", U2), StoppedDomain("gone", U3)])
    # "b" by that name is another domain now (another UUID): the recorded one is gone.
    domains = [
        dom("a", U1, "shutoff"),
        dom("b", "00000000-0000-4000-8000-00000000000f", "shutoff"),
        dom("c", "00000000-0000-4000-8000-00000000000e", "shutoff"),
    ]
    plan = plan_restore(record, domains)
    assert [d.name for d in plan.start] == ["a"]
    assert len(plan.warnings) == 2 and all("not started" in w for w in plan.warnings)
    assert [a.describe() for a in plan.actions] == [f"remove /{RECORD} (the drained VMs are back)"]
    assert not plan_restore(None, domains).actions


# ---------------------------------------------------------------- what the concerns disrupt


def test_only_a_reboot_the_play_carries_out_disrupts() -> None:
    assert boot_disruption(BootPlan(reboot="trial"), True).reboot
    assert not boot_disruption(BootPlan(reboot="trial"), False)  # not allowed: the role fails, no reboot
    assert not boot_disruption(BootPlan(reboot="none"), True)


def test_vfio_disrupts_the_devices_it_rebinds_or_refuses_as_in_use() -> None:
    plan = VfioPlan(bind_set=[GPU, "0000:41:00.1"])
    plan.actions = [Action(WRITE_SYSFS, "bind", "sys/bus/pci/drivers_probe", a) for a in plan.bind_set]
    assert vfio_disruption(plan, True).devices == [GPU, "0000:41:00.1"]
    assert not vfio_disruption(plan, False)  # below a staged root nothing runs
    held = VfioPlan(bind_set=[GPU, "0000:41:00.1"], refusals=[Refusal("in use", "stop it", GPU, "in-use")])
    assert vfio_disruption(held, True).devices == [GPU, "0000:41:00.1"]
    other = VfioPlan(
        bind_set=[GPU], refusals=[Refusal("boot display", "no", GPU), Refusal("in use", "x", GPU, "in-use")]
    )
    assert not vfio_disruption(other, True)  # refused anyway: it changes nothing


def test_vgpu_disrupts_removed_mdevs_cleared_vfs_remade_vfs_and_mig_changes() -> None:
    plan = VgpuPlan(
        removed_mdevs=[{"parent": GPU, "type": "nvidia-1", "uuid": MDEV}],
        cleared_vfs=[{"vf": VF, "type": 5}],
        mig={OTHER: {"destroyed": [{"gi": 1}]}, "0000:c1:00.0": {"created": ["1g.10gb"], "destroyed": []}},
    )
    plan.actions = [Action(WRITE_SYSFS, "VFs", "sys/bus/pci/devices/0000:a1:00.0/sriov_numvfs", "0")]
    assert vgpu_disruption(plan, True).devices == sorted([MDEV, VF, OTHER, "0000:a1:00.0"])


# ---------------------------------------------------------------- the record, read as untrusted input


def test_the_record_reads_back_what_gpuprov_wrote() -> None:
    record = DrainRecord(stopped=[StoppedDomain("a", U1), StoppedDomain("web 1", U2)], reason="reboot")
    assert parse_record(record_text(record)) == record


HOSTILE = {
    "not json": "{",
    "deep": "[" * 10_000,
    "a list": "[]",
    "extra key": json.dumps({"version": 1, "reason": "", "stopped": [], "cmd": "rm"}),
    "version 2": json.dumps({"version": 2, "reason": "", "stopped": []}),
    "version true": json.dumps({"version": True, "reason": "", "stopped": []}),
    "name with slash": json.dumps({"version": 1, "reason": "", "stopped": [{"name": "../x", "uuid": U1}]}),
    "name with newline": json.dumps({"version": 1, "reason": "", "stopped": [{"name": "a\nb", "uuid": U1}]}),
    "name a number": json.dumps({"version": 1, "reason": "", "stopped": [{"name": 1, "uuid": U1}]}),
    "uuid upper": json.dumps({"version": 1, "reason": "", "stopped": [{"name": "a", "uuid": MDEV.upper()}]}),
    "uuid twice": json.dumps(
        {"version": 1, "reason": "", "stopped": [{"name": "a", "uuid": U1}, {"name": "b", "uuid": U1}]}
    ),
    "too many": json.dumps({"version": 1, "reason": "", "stopped": [{"name": "a", "uuid": U1}] * 1025}),
    "huge number": '{"version": ' + "9" * 5000 + ', "reason": "", "stopped": []}',
}


@pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_record_is_refused(text: str) -> None:
    with pytest.raises(RecordError):
        parse_record(text)


def test_the_record_file_no_file_a_large_one_a_fifo_and_bad_bytes(tmp_path: Path) -> None:
    sysfs = Sysfs(str(tmp_path))
    assert read_record(sysfs) is None
    path = tmp_path / RECORD
    path.parent.mkdir(parents=True)
    path.write_text(" " * (MAX_RECORD_CHARS + 1))
    with pytest.raises(RecordError, match="larger"):
        read_record(sysfs)
    path.write_bytes(b'{"version": 1, "reason": "\xff", "stopped": []}')
    with pytest.raises(RecordError, match="UTF-8"):
        read_record(sysfs)
    path.unlink()
    os.mkfifo(path)  # a FIFO would block a plain read
    with pytest.raises(RecordError, match="regular"):
        read_record(sysfs)


# ---------------------------------------------------------------- the module, against libvirt's test driver

URI = "test:///default"


def _domain_xml(name: str, hostdev: str) -> str:
    return (
        f"<domain type='test'><name>{name}</name><memory>1024</memory><os><type>hvm</type></os>"
        f"<devices>{hostdev}</devices></domain>"
    )


def _pci(address: str) -> str:
    d, b, rest = address.split(":")
    s, f = rest.split(".")
    return (
        "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
        f"<address domain='0x{d}' bus='0x{b}' slot='0x{s}' function='0x{f}'/></source></hostdev>"
    )


def _mdev(uuid: str) -> str:
    return f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{uuid}'/></source></hostdev>"


@pytest.fixture
def libvirt_test() -> Any:
    """libvirt's test driver, shared by every connection of this process: three running domains,
    one holding GPU, one an mdev, one OTHER; the driver's own "test" domain shut off. Removed after."""
    libvirt = pytest.importorskip("libvirt")
    conn = libvirt.open(URI)
    made = []
    for name, hostdev in (("drain-gpu", _pci(GPU)), ("drain-mdev", _mdev(MDEV)), ("drain-other", _pci(OTHER))):
        dom = conn.defineXML(_domain_xml(name, hostdev))
        dom.create()
        made.append(dom)
    builtin = conn.lookupByName("test")
    if builtin.isActive():
        builtin.destroy()
    yield conn
    for dom in made:
        if dom.isActive():
            dom.destroy()
        dom.undefine()
    builtin.create()
    conn.close()


def _states(conn: Any) -> dict[str, bool]:
    return {d.name(): bool(d.isActive()) for d in conn.listAllDomains() if d.name().startswith("drain-")}


def _drain(root: Path, check: bool = False, **args: Any) -> dict[str, Any]:
    return run_in_process("gpu_host_drain", {"uri": URI, "root": str(root), "timeout": 5, **args}, check=check)


VMS = [{"name": "drain-gpu"}, {"name": "drain-mdev", "drain": "force"}, {"name": "drain-other", "drain": "keep"}]


def test_module_check_drain_restore_by_device(libvirt_test: Any, tmp_path: Path) -> None:
    disruption = {"devices": [GPU.upper(), MDEV], "why": ["vfio_bind: rebinds"]}
    checked = _drain(tmp_path, check=True, disruption=disruption, vms=VMS)
    assert not checked["failed"], checked.get("msg")
    assert checked["changed"] and checked["stopped"] == ["would drain-gpu", "would drain-mdev"]
    assert all(_states(libvirt_test).values()) and not (tmp_path / RECORD).exists()  # check mode: nothing

    drained = _drain(tmp_path, disruption=disruption, vms=VMS)
    assert not drained["failed"], drained.get("msg")
    assert drained["stopped"] == ["drain-gpu", "drain-mdev"] and drained["forced"] == ["drain-mdev"]
    assert _states(libvirt_test) == {"drain-gpu": False, "drain-mdev": False, "drain-other": True}
    record = read_record(Sysfs(str(tmp_path)))
    assert record is not None and [d.name for d in record.stopped] == ["drain-gpu", "drain-mdev"]

    again = _drain(tmp_path, disruption=disruption, vms=VMS)
    assert not again["failed"] and not again["changed"]  # stopped already

    would = _drain(tmp_path, check=True, state="restored")
    assert would["started"] == ["would drain-gpu", "would drain-mdev"] and (tmp_path / RECORD).exists()
    restored = _drain(tmp_path, state="restored")
    assert not restored["failed"], restored.get("msg")
    assert restored["started"] == ["drain-gpu", "drain-mdev"] and all(_states(libvirt_test).values())
    assert not (tmp_path / RECORD).exists()
    assert not _drain(tmp_path, state="restored")["changed"]  # no record: nothing to do


def test_module_refuses_a_kept_vm_and_stops_nothing(libvirt_test: Any, tmp_path: Path) -> None:
    result = _drain(tmp_path, disruption={"reboot": True}, vms=VMS)
    assert result["failed"] and "VM drain-other is declared drain: keep" in result["msg"]
    assert result["msg"].startswith("refused, nothing changed")
    assert all(_states(libvirt_test).values()) and not (tmp_path / RECORD).exists()


def test_module_refuses_a_hostile_record_and_bad_inputs(libvirt_test: Any, tmp_path: Path) -> None:
    path = tmp_path / RECORD
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1, "reason": "", "stopped": [{"name": "x;reboot", "uuid": "nope"}]}')
    for state in ("drained", "restored"):
        result = _drain(tmp_path, state=state, disruption={"reboot": True}, vms=VMS)
        assert result["failed"] and "not one gpuprov wrote" in result["msg"], result
    assert all(_states(libvirt_test).values()) and path.exists()
    bad = _drain(tmp_path, disruption={"devices": ["gpu0"]}, vms=[{"name": "a", "drain": "sometimes"}])
    kept_by_default = _drain(tmp_path.parent, disruption={"reboot": True}, vms=VMS[:1], defaults={"drain": "keep"})
    assert kept_by_default["failed"] and "drain-gpu is declared drain: keep" in kept_by_default["msg"]
    assert bad["failed"] and "disruption.devices[0]" in bad["msg"] and "vms[0].drain" in bad["msg"]


def test_module_with_nothing_disrupted_does_not_consult_libvirt(tmp_path: Path) -> None:
    result = _drain(tmp_path, uri="qemu:///nowhere")
    assert not result["failed"] and not result["changed"] and result["stopped"] == []
    staged = _drain(tmp_path, uri="qemu:///system", disruption={"reboot": True})
    assert staged["failed"] and "not /" in staged["msg"]  # another host's libvirt is never read


def test_a_host_without_the_systems_libvirt_has_nothing_to_drain() -> None:
    """A bare host (libvirt not installed yet: no libvirtd or virtqemud socket) runs no libvirt VM:
    the drain reads nothing and stops nothing. Any socket there, another URI or a staged root:
    libvirt is read (or the drain refuses), as before."""
    from types import SimpleNamespace

    from gpuprov.facts.libvirt import SYSTEM_SOCKETS, system_libvirt_absent

    def host(*present: str, live: bool = True) -> Any:
        return SimpleNamespace(live=live, exists=lambda rel: rel in present)

    assert system_libvirt_absent(host(), "qemu:///system")
    for socket in SYSTEM_SOCKETS:
        assert not system_libvirt_absent(host(socket), "qemu:///system"), socket
    assert not system_libvirt_absent(host(), "qemu:///session")
    assert not system_libvirt_absent(host(), "test:///default")
    assert not system_libvirt_absent(host(live=False), "qemu:///system")
