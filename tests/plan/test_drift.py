"""Drift (gpuprov/plan/drift.py) through the host's record (gpuprov/report/fleet.py host_record), on
staged captures and the synthetic vGPU host: each kind of difference found, naming the declared
entry (or the configuration file) and the device, and nothing where the host is as declared."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gpuprov.report.fleet import host_record
from tests import fleethosts, vgpuhosts

ENTRY = "gpuprov_host.gpus[0] 'gpu'"


def record(root: Path, host: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    return host_record(str(root), None if host is None else {"gpuprov_host": host, **extra})


def codes(r: dict[str, Any]) -> list[str]:
    return sorted(d["code"] for d in r["drift"])


@pytest.fixture
def passthrough(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    return fleethosts.converged("passthrough", tmp_path / "root")


# ---------------------------------------------------------------- the id guard and drivers


def test_a_converged_passthrough_host_has_no_drift(passthrough: tuple[Path, dict[str, Any]]) -> None:
    root, host = passthrough
    r = record(root, host)
    assert (r["status"], r["drift"], r["not_ready"], r["unknown"]) == ("converged", [], [], [])
    (gpu,) = r["gpus"]
    assert (gpu["use"], gpu["entry"], gpu["verdict"], gpu["driver"]) == (
        "passthrough",
        ENTRY,
        "passthrough-ready",
        "vfio-pci",
    )


def test_other_hardware_at_the_declared_address_is_the_id_guard(passthrough: tuple[Path, dict[str, Any]]) -> None:
    root, host = passthrough
    host["gpus"][0]["expect"] = "10de:2330"
    r = record(root, host)
    (d,) = r["drift"]
    assert (d["code"], d["entry"], d["device"]) == ("gpu-changed", ENTRY, fleethosts.EDU)
    assert "1234:11e8" in d["message"] and "10de:2330" in d["message"]


def test_a_moved_gpu_without_expect_names_the_undeclared_gpus(tmp_path: Path) -> None:
    root, host = fleethosts.converged("host", tmp_path / "root")
    fleethosts.move(root, fleethosts.H100, "0000:00:07.0")
    r = record(root, host)
    (d,) = r["drift"]
    assert (d["code"], d["device"]) == ("gpu-missing", fleethosts.H100)
    assert "undeclared GPU(s) here: 0000:00:07.0 (10de:2330)" in d["message"]


def test_a_gpu_kept_by_the_host_but_bound_to_vfio_is_drift_and_not_ready(tmp_path: Path) -> None:
    root, host = fleethosts.converged("host", tmp_path / "root")
    fleethosts.bind(root, fleethosts.H100, "vfio-pci")
    r = record(root, host)
    assert codes(r) == ["driver"] and "the host cannot use it" in r["drift"][0]["message"]
    assert r["status"] == "not ready" and [n["code"] for n in r["not_ready"]] == ["declared-use-mismatch"]


def test_a_vgpu_gpu_needs_the_nvidia_driver(tmp_path: Path) -> None:
    fake = vgpuhosts.build(tmp_path / "root")
    fake.finish()
    fleethosts.bind(tmp_path / "root", vgpuhosts.MDEV_GPU, "nouveau")
    host = {"version": 1, "gpus": [{"name": "v", "address": vgpuhosts.MDEV_GPU, "use": "mdev"}]}
    r = record(tmp_path / "root", host)
    (d,) = r["drift"]
    assert (d["code"], d["device"]) == ("driver", vgpuhosts.MDEV_GPU) and "NVIDIA host driver" in d["message"]


def test_no_declaration_means_no_drift_and_gpus_not_declared(tmp_path: Path) -> None:
    root, _host = fleethosts.converged("host", tmp_path / "root")
    r = record(root, None)
    assert (r["status"], r["drift"], r["not_ready"]) == ("converged", [], [])
    assert [g["verdict"] for g in r["gpus"]] == ["not declared"] and not r["declaration"]["given"]


def test_a_broken_declaration_is_not_ready_not_drift(passthrough: tuple[Path, dict[str, Any]]) -> None:
    root, host = passthrough
    host["gpus"][0]["use"] = "everything"
    r = record(root, host)
    assert r["status"] == "not ready" and r["drift"] == []
    assert [n["code"] for n in r["not_ready"]] == ["declaration"] and "use" in r["not_ready"][0]["message"]


# ---------------------------------------------------------------- the vGPU layout


@pytest.fixture
def vgpu(tmp_path: Path) -> Path:
    fake = vgpuhosts.build(tmp_path / "root", current={vgpuhosts.SRIOV_VFS[0]: 557, vgpuhosts.SRIOV_VFS[1]: 558})
    vgpuhosts.mdev_instance(fake, vgpuhosts.MDEV_GPU, "nvidia-259", "11111111-2222-3333-4444-555555555555", 300)
    fake.finish()
    return tmp_path / "root"


VGPU_HOST = {
    "version": 1,
    "gpus": [
        {"name": "a", "address": vgpuhosts.SRIOV_PF, "use": "sriov_vgpu", "instances": ["x"]},
        {"name": "m", "address": vgpuhosts.MIG_GPU, "use": "mig", "mig": {"1g.10gb": 1, "3g.40gb": 1}},
        {
            "name": "v",
            "address": vgpuhosts.MDEV_GPU,
            "use": "mdev",
            "instances": [{"type": "nvidia-259", "uuid": "11111111-2222-3333-4444-555555555555"}],
        },
    ],
}


def vgpu_host(**changes: Any) -> dict[str, Any]:
    host = copy.deepcopy(VGPU_HOST)
    host["gpus"][0]["instances"] = [{"type": "NVIDIA A100-4C"}, {"type": "NVIDIA A100-8C"}]
    for name, value in changes.items():
        next(g for g in host["gpus"] if g["name"] == name).update(value)
    return host


def test_the_vgpu_layout_as_declared_is_no_drift(vgpu: Path) -> None:
    r = record(vgpu, vgpu_host())
    assert (r["drift"], r["unknown"]) == ([], [{"what": "kernel arguments", "why": r["unknown"][0]["why"]}])
    assert r["status"] == "unknown"  # the vGPU uses rest on the kernel's arguments: never converged unread
    assert {g["address"]: g["verdict"] for g in r["gpus"] if g["use"] != "not declared"} == {
        vgpuhosts.SRIOV_PF: "vGPU-ready",
        vgpuhosts.MIG_GPU: "vGPU-ready",
        vgpuhosts.MDEV_GPU: "vGPU-ready",
    }


def test_a_vf_with_another_vgpu_type(vgpu: Path) -> None:
    host = vgpu_host(a={"instances": [{"type": "NVIDIA A100-8C"}, {"type": "NVIDIA A100-8C"}]})
    (d,) = record(vgpu, host)["drift"]
    assert (d["code"], d["entry"], d["device"]) == ("vgpu-type", "gpuprov_host.gpus[0] 'a'", vgpuhosts.SRIOV_VFS[0])
    assert "has vGPU type 557; declared: NVIDIA A100-8C (558)" in d["message"]


def test_an_mdev_missing_of_another_type_or_not_declared(vgpu: Path) -> None:
    other = {"type": "nvidia-260", "uuid": "11111111-2222-3333-4444-555555555555"}
    (d,) = record(vgpu, vgpu_host(v={"instances": [other]}))["drift"]
    assert (d["code"], d["entry"]) == ("mdev-changed", "gpuprov_host.gpus[2] 'v'")
    assert "is type nvidia-259" in d["message"]
    missing = {"type": "nvidia-259", "uuid": "99999999-2222-3333-4444-555555555555"}
    found = record(vgpu, vgpu_host(v={"instances": [missing]}))["drift"]
    assert sorted(d["code"] for d in found) == ["mdev-extra", "mdev-missing"]
    assert all(d["entry"] == "gpuprov_host.gpus[2] 'v'" and d["device"] == vgpuhosts.MDEV_GPU for d in found)


def test_mig_instances_or_mode_not_as_declared(vgpu: Path, tmp_path: Path) -> None:
    (d,) = record(vgpu, vgpu_host(m={"mig": ["1g.10gb", "1g.10gb"]}))["drift"]
    assert (d["code"], d["device"]) == ("mig-layout", vgpuhosts.MIG_GPU)
    assert d["message"] == "MIG GPU instances: 1g.10gb x1, 3g.40gb x1; declared: 1g.10gb x2"
    (vgpu / "capture/nvidia-smi-mig-query").unlink()
    r = record(vgpu, vgpu_host())
    assert r["drift"] == [] and {"what": "MIG layout", "why": r["unknown"][0]["why"]} in r["unknown"]


# ---------------------------------------------------------------- VMs


def vm_host(host: dict[str, Any], state: str | None = None) -> dict[str, Any]:
    vm: dict[str, Any] = {"name": "train", "gpus": ["gpu"]}
    if state:
        vm["state"] = state
    return {**host, "vms": [vm]}


def running(root: Path, name: str, address: str) -> None:
    dom, bus, rest = address.split(":")
    slot, fn = rest.split(".")
    xml = (
        f"<domstatus><domain><name>{name}</name><devices><hostdev mode='subsystem' type='pci'><source>"
        f"<address domain='0x{dom}' bus='0x{bus}' slot='0x{slot}' function='0x{fn}'/></source></hostdev>"
        "</devices></domain></domstatus>"
    )
    (root / "run/libvirt/qemu").mkdir(parents=True, exist_ok=True)
    (root / "run/libvirt/qemu" / f"{name}.xml").write_text(xml)


def test_vm_state_against_libvirt(passthrough: tuple[Path, dict[str, Any]]) -> None:
    root, host = passthrough
    (d,) = record(root, vm_host(host))["drift"]
    assert (d["code"], d["entry"]) == ("vm-state", "gpuprov_host.vms[0] 'train'")
    assert d["message"] == "VM 'train' is not defined; declared state: running"
    running(root, "train", fleethosts.EDU)
    r = record(root, vm_host(host))
    assert r["drift"] == [] and r["gpus"][0]["verdict"] == "in use by VM train"
    (d,) = record(root, vm_host(host, "absent"))["drift"]
    assert d["message"] == "VM 'train' is running; declared state: absent"
    (d,) = record(root, vm_host(host, "shutdown"))["drift"]
    assert d["code"] == "vm-state"


def test_a_running_vm_without_its_declared_gpu(passthrough: tuple[Path, dict[str, Any]]) -> None:
    root, host = passthrough
    running(root, "train", "0000:02:00.0")
    (d,) = record(root, vm_host(host))["drift"]
    assert (d["code"], d["device"]) == ("vm-devices", fleethosts.EDU)
    assert "does not hold 0000:01:00.0" in d["message"] and "0000:02:00.0" in d["message"]


@pytest.mark.parametrize("how", ["a file", "a link loop"])
def test_vm_state_unknown_when_libvirt_cannot_be_read(passthrough: tuple[Path, dict[str, Any]], how: str) -> None:
    root, host = passthrough
    assert record(root, host)["status"] == "converged"
    (root / "run/libvirt").mkdir(parents=True)
    folder = root / "run/libvirt/qemu"
    if how == "a file":
        folder.write_text("not a folder: it cannot be listed, as one root alone may read\n")
    else:
        folder.symlink_to("qemu")
    r = record(root, vm_host(host))
    assert r["drift"] == [] and r["unknown"][0]["what"] == "VM state"
    assert r["status"] == "unknown"  # fail closed: what cannot be read is never converged


def test_kernel_arguments_unread_are_unknown_only_where_a_use_rests_on_them(
    passthrough: tuple[Path, dict[str, Any]],
) -> None:
    root, host = passthrough
    (root / "etc/default/grub").unlink()
    r = record(root, host)
    assert r["status"] == "unknown" and [u["what"] for u in r["unknown"]] == ["kernel arguments"]
    kept = {"version": 1, "gpus": [{"name": "gpu", "address": fleethosts.EDU, "use": "host"}]}
    r = record(root, kept)
    assert r["unknown"] == [] and r["status"] != "unknown"


# ---------------------------------------------------------------- kernel arguments


def grub(root: Path, default: str, linux: str = "") -> None:
    (root / "etc/default/grub").write_text(f'GRUB_CMDLINE_LINUX_DEFAULT="{default}"\nGRUB_CMDLINE_LINUX="{linux}"\n')


BOOTED = "console=ttyS0 intel_iommu=on iommu=pt panic=-1"


def test_configured_arguments_not_booted_owe_a_reboot(passthrough: tuple[Path, dict[str, Any]]) -> None:
    root, host = passthrough
    grub(root, BOOTED, "vfio-pci.ids=1234:11e8")
    (d,) = record(root, host)["drift"]
    assert (d["code"], d["entry"]) == (
        "kernel-args",
        "/etc/default/grub GRUB_CMDLINE_LINUX + GRUB_CMDLINE_LINUX_DEFAULT",
    )
    assert d["message"].startswith("configured vfio-pci.ids=1234:11e8, but the running kernel booted without it")
    grub(root, BOOTED.replace("iommu=pt", "iommu=nopt"))
    (d,) = record(root, host)["drift"]
    assert "configured iommu=nopt" in d["message"]


def test_booted_iommu_arguments_no_longer_configured(passthrough: tuple[Path, dict[str, Any]]) -> None:
    root, host = passthrough
    grub(root, "console=ttyS0 panic=-1")
    (d,) = record(root, host)["drift"]
    assert d["message"].startswith(
        "the running kernel booted with intel_iommu=on, iommu=pt, which is no longer configured"
    )


def test_a_dropin_overrides_the_defaults_file(passthrough: tuple[Path, dict[str, Any]]) -> None:
    root, host = passthrough
    grub(root, "quiet")
    (root / "etc/default/grub.d").mkdir()
    (root / "etc/default/grub.d/50-cloud.cfg").write_text(f'GRUB_CMDLINE_LINUX_DEFAULT="{BOOTED}"\n')
    assert record(root, host)["drift"] == []
    (root / "etc/default/grub.d/50-cloud.cfg").write_text(
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT x"\n'
    )
    r = record(root, host)
    assert r["drift"] == [] and r["unknown"][0]["what"] == "kernel arguments"
    assert "50-cloud.cfg" in r["unknown"][0]["why"]


def test_kernel_cmdline_file_without_grub(passthrough: tuple[Path, dict[str, Any]]) -> None:
    root, host = passthrough
    (root / "etc/default/grub").unlink()
    (root / "etc/kernel").mkdir()
    (root / "etc/kernel/cmdline").write_text(BOOTED + " amd_iommu=on\n")
    (d,) = record(root, host)["drift"]
    assert d["entry"] == "/etc/kernel/cmdline" and "configured amd_iommu=on" in d["message"]


# ---------------------------------------------------------------- CDI


def cdi(root: Path, devices: list[str], driver: str = "580.65.06") -> None:
    names = "".join(f'  - name: "{n}"\n    containerEdits: {{}}\n' for n in devices)
    lib = f"  mounts:\n  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{driver}\n"
    (root / "etc/cdi").mkdir(parents=True, exist_ok=True)
    (root / "etc/cdi/nvidia.yaml").write_text(
        f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n{names}containerEdits:\n{lib}"
    )


def test_cdi_spec_against_the_gpus_present(tmp_path: Path) -> None:
    root, host = fleethosts.converged("host", tmp_path / "root")
    cdi(root, ["0", "all"])
    assert record(root, host)["drift"] == []
    cdi(root, ["0", "1", "all"])
    (d,) = record(root, host)["drift"]
    assert (d["code"], d["entry"]) == ("cdi-extra-device", "/etc/cdi/nvidia.yaml") and "device(s) 1" in d["message"]
    cdi(root, ["all"])
    (d,) = record(root, host)["drift"]
    assert d["code"] == "cdi-missing-gpu" and f"GPU 0 ({fleethosts.H100})" in d["message"]


def test_cdi_spec_for_another_driver_or_unreadable(tmp_path: Path) -> None:
    root, host = fleethosts.converged("host", tmp_path / "root")
    (root / "proc/driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Thu\n")
    cdi(root, ["0", "all"], driver="580.65.06")
    (d,) = record(root, host)["drift"]
    assert d["code"] == "cdi-driver" and "580.65.06" in d["message"] and "580.95.05" in d["message"]
    (root / "etc/cdi/nvidia.yaml").write_text("kind: 'not a kind'\n")
    (d,) = record(root, host)["drift"]
    assert d["code"] == "cdi-spec"
