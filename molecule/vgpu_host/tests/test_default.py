"""vgpu_host after converge and idempotence, on two host roots at /srv/host.

gpuprov-vgpu-mtty: the mtty-mdev capture (parent "mtty", one mtty-2 mdev
83b8f4f2-... made by hand); the role declares an mtty-2 with a fixed UUID and a
"Single port serial" (mtty-1) whose UUID is derived. gpuprov-vgpu-nvidia: the
synthetic NVIDIA host (tests/vgpuhosts.py): V100 mdevs, A100 SR-IOV VF types, an
A100 80GB MIG layout, VFs to enable, the fixed-share scheduler. On these staged
roots the sysfs writes and commands are reported, not run: the tests check the
files that keep the layout across reboots, that the copied boot planner runs on
the instance's own Python, check mode, refusals, and nothing written elsewhere.
Helpers and fixtures: molecule/conftest.py.
"""

from __future__ import annotations

import configparser
import json

import pytest
from role_checks import RoleChecks

from gpuprov.plan.vgpu import derived_uuid

LAB_UUID = "5e2bb1d2-6a4b-4c4e-9b1a-0f0e2d1c0b01"
MTTY_EXISTING = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
STATE = "etc/gpuprov/vgpu.json"
UNIT = "etc/systemd/system/gpuprov-vgpu.service"
SCHEDULER = "etc/modprobe.d/gpuprov-vgpu-scheduler.conf"


@pytest.fixture
def kind(hostvars) -> str:
    return hostvars["vgpu_molecule_root_from"]


@pytest.fixture
def scratch(host, kind):
    """scratch(path): a fresh root of this instance's kind (the mtty capture or the NVIDIA host)."""

    def make(path: str) -> str:
        host.run_expect([0], "/usr/local/sbin/gpuprov-molecule-root %s %s", kind, path)
        return path

    return make


def json_file(host, path: str) -> dict:
    f = host.file(path)
    assert f.is_file and f.user == "root" and f.mode == 0o644, path
    return json.loads(f.content_string)


def test_mdevctl_definitions_and_saved_layout_mtty(host, root, kind):
    if kind != "mtty-mdev":
        pytest.skip("the mtty capture")
    derived = derived_uuid("mtty", "mtty-1", 0)
    for uuid, mtype in ((LAB_UUID, "mtty-2"), (derived, "mtty-1")):
        assert json_file(host, f"{root}/etc/mdevctl.d/mtty/{uuid}") == {
            "mdev_type": mtype,
            "start": "auto",
            "attrs": [],
        }
    # The hand-made mdev is not gpuprov's: no definition, and it is not in the saved layout.
    assert not host.file(f"{root}/etc/mdevctl.d/mtty/{MTTY_EXISTING}").exists
    saved = json_file(host, f"{root}/{STATE}")
    assert saved["gpus"] == {
        "mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": LAB_UUID}, {"type": "mtty-1", "uuid": derived}]}
    }
    # mdevs only: mdevctl restarts them; no boot unit, no planner copy, no scheduler.
    for path in (UNIT, "usr/lib/gpuprov", SCHEDULER):
        assert not host.file(f"{root}/{path}").exists, path


def test_nvidia_layout_files(host, root, kind):
    if kind != "nvidia-vgpu-host":
        pytest.skip("the synthetic NVIDIA host")
    saved = json_file(host, f"{root}/{STATE}")
    assert saved["gpus"]["0000:c1:00.0"]["vgpus"] == [
        {"type": 557, "vf": "0000:c1:00.4"},
        {"type": 557, "vf": "0000:c1:00.6"},
    ]
    assert saved["gpus"]["0000:e1:00.0"] == {"use": "mig", "mig": ["3g.40gb", "1g.10gb", "1g.10gb"]}
    assert saved["vgpu_type_names"] == {"557": "NVIDIA A100-4C"}
    v100 = [derived_uuid("0000:81:00.0", "nvidia-259", i) for i in (0, 1)]
    for uuid in v100:
        assert json_file(host, f"{root}/etc/mdevctl.d/0000:81:00.0/{uuid}")["mdev_type"] == "nvidia-259"


def test_scheduler_options_parse_with_modprobe(host, root, kind):
    if kind != "nvidia-vgpu-host":
        pytest.skip("the synthetic NVIDIA host")
    out = host.run("modprobe -C %s/%s --showconfig", root, SCHEDULER)
    assert out.rc == 0 and "ignoring bad line" not in out.stderr, out.stderr
    options = [line for line in out.stdout.splitlines() if line.startswith("options nvidia ")]
    assert options == ["options nvidia NVreg_RegistryDwords=RmPVMRL=0x11"] or options == [
        'options nvidia NVreg_RegistryDwords="RmPVMRL=0x11"'
    ], out.stdout


def test_boot_unit(host, root, kind):
    if kind != "nvidia-vgpu-host":
        pytest.skip("the synthetic NVIDIA host")
    f = host.file(f"{root}/{UNIT}")
    assert f.is_file and f.user == "root" and f.mode == 0o644
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string(f.content_string)
    assert unit["Service"]["Type"] == "oneshot"
    assert (
        unit["Service"]["ExecStart"]
        == "/usr/bin/python3 /usr/lib/gpuprov/gpuprov-vgpu.pyz --state /etc/gpuprov/vgpu.json"
    )
    assert unit["Service"]["Environment"] == "PYTHONDONTWRITEBYTECODE=1"
    assert "nvidia-vgpu-mgr.service" in unit["Unit"]["After"] and "libvirtd.service" in unit["Unit"]["Before"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_boot_zipapp_runs_on_the_instance_python(host, root, kind):
    """What the unit runs at boot, the zipapp the role installed, on the instance's python3 (no gpuprov installed)."""
    if kind != "nvidia-vgpu-host":
        pytest.skip("the synthetic NVIDIA host")
    assert host.run("python3 -c 'import gpuprov'").rc != 0
    pyz = host.file(f"{root}/usr/lib/gpuprov/gpuprov-vgpu.pyz")
    assert pyz.is_file and pyz.mode == 0o644
    assert not host.file(f"{root}/usr/lib/gpuprov/gpuprov").exists  # no planner copy any more
    cmd = f"cd / && python3 -I {root}/usr/lib/gpuprov/gpuprov-vgpu.pyz --root {root} --state {root}/{STATE}"
    check = host.run(cmd + " --check")
    assert check.rc == 0, check.stderr
    lines = check.stdout.splitlines()
    assert sum("current_vgpu_type" in line and "write '557'" in line for line in lines) == 2, check.stdout
    assert any("nvidia-smi mig -i 3 -cgi 19 -C" in line for line in lines), check.stdout
    assert any("sriov-manage -e 0000:41:00.0" in line for line in lines), check.stdout
    assert not any("mdev" in line for line in lines), check.stdout  # mdevctl starts those at boot
    run = host.run(cmd)
    assert run.rc == 0 and "not run (root is not /)" in run.stdout, run.stdout + run.stderr


REFUSALS = {
    "mtty-mdev": (
        {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-9"}]}},
        "mdev type 'mtty-9' is not offered by mtty",
    ),
    "nvidia-vgpu-host": (
        {"0000:c1:00.0": {"use": "sriov_vgpu", "vgpus": [{"type": 557}, {"type": "NVIDIA A100-8C"}]}},
        "mixed vGPU types on 0000:c1:00.0",
    ),
}


@pytest.mark.parametrize("check", [False, True], ids=["apply", "check"])
def test_a_refused_layout_writes_nothing(converge, scratch, digest, kind, check):
    fresh = scratch("/srv/refuse")
    before = digest(fresh)
    gpus, text = REFUSALS[kind]
    run = converge({"vgpu_host_root": fresh, "vgpu_host_gpus": gpus}, check=check)
    assert run.failures > 0, run.output
    assert any(text in msg and "nothing changed" in msg for msg in run.failed_msgs), run.failed_msgs
    assert digest(fresh) == before


def test_dropping_an_mdev_removes_its_definition(host, converge, scratch, kind):
    """gpuprov's own mdev, no longer declared: its definition goes; the hand-made one stays untouched."""
    if kind != "mtty-mdev":
        pytest.skip("the mtty capture")
    fresh = scratch("/srv/drop")
    full = {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": LAB_UUID}, {"type": "mtty-1"}]}}
    assert converge({"vgpu_host_root": fresh, "vgpu_host_gpus": full}).changed > 0
    fewer = {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": LAB_UUID}]}}
    dropped = converge({"vgpu_host_root": fresh, "vgpu_host_gpus": fewer})
    assert dropped.failures == 0 and dropped.changed > 0, dropped.output
    assert not host.file(f"{fresh}/etc/mdevctl.d/mtty/{derived_uuid('mtty', 'mtty-1', 0)}").exists
    assert host.file(f"{fresh}/etc/mdevctl.d/mtty/{LAB_UUID}").exists
    again = converge({"vgpu_host_root": fresh, "vgpu_host_gpus": fewer})
    assert again.failures == 0 and again.changed == 0, (again.changed_tasks, again.output)


class TestSharedChecks(RoleChecks):
    """Only under the staged root, check mode right (molecule/_shared/role_checks.py)."""

    @pytest.fixture
    def fresh_root(self, scratch):
        return scratch
