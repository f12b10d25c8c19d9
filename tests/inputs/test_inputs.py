"""Hostile host_vars files and module options (issue 11, category 5), and gpu_vm with a
staged root (category 7).

Every hostile field goes through ``gpuprov plan`` as a subprocess (exit 2, the field named,
no traceback, in bounded CPU time and under a 1 GiB address-space limit) and, where the
field has a module form, through gpu_vm or gpu_vgpu in process (a refusal naming the field,
nothing changed). The same verdict from both is the point: one validation boundary
(gpuprov/inputs.py, rules in gpuprov/validate.py, docs/reference/inputs.md)."""

from __future__ import annotations

import copy
import os
import random
import resource
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuprov.cli.yamlread import MAX_BYTES
from gpuprov.core.vm_spec import ROM_DIR, HostSettings
from gpuprov.facts.vm_storage import rom_file_problem
from gpuprov.inputs.boundary import (
    GPU_VMS_VARIABLES,
    validate_gpu_vgpu_options,
    validate_gpu_vm_options,
    validate_host_vars,
)
from gpuprov.inputs.validate import Problems, cpu_list, ssh_key
from gpuprov.plan.vm.fit import plan_host
from tests.conftest import run_timed_by_cpu, tree_digest
from tests.modrun import run_in_process
from tests.vmhosts import nvidia_vgpu_host, ssh_public_key

REPO = Path(__file__).resolve().parents[2]
UUID = "5e2bb1d2-6a4b-4c4e-9b1a-0f0e2d1c0c01"
KEY = ssh_public_key("admin@example")
# A host_vars file that plans cleanly on the mtty-mdev capture (2 CPUs, 960 MiB, the mtty parent).
BASE: dict[str, Any] = {
    "gpu_vms_reserved_memory_mib": 0,
    "gpu_vms_reserved_cpus": "",
    "gpu_vms_mixed_vgpu_types": False,
    "gpu_vms_defaults": {"memory_mib": 128},
    "gpu_vms_list": [
        {
            "name": "vm-a",
            "vcpus": 1,
            "firmware": "bios",
            "accel": "tcg",
            "machine": "q35",
            "mdevs": [{"parent": "mtty", "type": "mtty-1", "uuid": UUID}],
            "cpuset": "1",
            "pin": True,
            "hugepages": "auto",
            "hide_kvm": False,
            "vendor_id": "gpuprov",
            "network": "default",
            "mac": "52:54:00:12:34:56",
            "disk": {"base": "/var/lib/libvirt/images/base.qcow2", "size_gib": 10},
            "cloud_init": {"user": "gpuadmin", "ssh_authorized_keys": [KEY], "hostname": "vm-a", "packages": ["htop"]},
            "boot": {"kernel": "/vmlinuz", "initrd": "/initrd.img", "cmdline": "console=ttyS0 quiet"},
            "autostart": False,
        }
    ],
    "gpuprov_gpus": {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-1", "uuid": UUID}]}},
}
# What a hostile file may cost plan, the whole process (the alias bomb took 36 s before): room for
# a loaded machine, where the 5,000-VM list took 2.01 s under Debian's python3 (test.sh's pass
# beside the lab, 2026-11-27; 2.8 s of wall time alone), and still far below the bomb.
CPU_SECONDS = 6.0
MEMORY_LIMIT = 1 << 30


def yaml_reads(text: str) -> Any:
    """What YAML makes of an unquoted value (52:54:00:12:34:56 is a base-60 number)."""
    return yaml.safe_load(f"x: {text}")["x"]


# ---------------------------------------------------------------- the cases


@dataclass
class Case:
    id: str
    path: tuple[str | int, ...]  # where in BASE the value goes
    value: Any
    field: str  # the field path plan names
    text: str  # and what it says
    module: str | None = "same"  # "same": the module names the field as plan does (vm./defaults./gpus);
    # None: no module form (Ansible types the option itself, see test_ansible_types_top_level_options)
    module_text: str | None = None  # what the module says, where it differs (JSON keys are strings)


def vm_field(key: str | int, *rest: str | int) -> tuple[str | int, ...]:
    return ("gpu_vms_list", 0, key, *rest)


LAYOUT_MDEV: tuple[str | int, ...] = ("gpuprov_gpus", "mtty", "mdevs", 0)
CASES = [
    # types
    Case("memory-abc", ("gpu_vms_reserved_memory_mib",), "abc", "gpu_vms_reserved_memory_mib", "whole number", None),
    Case("memory-negative", ("gpu_vms_reserved_memory_mib",), -100000, "gpu_vms_reserved_memory_mib", "out of range"),
    Case("memory-bool", ("gpu_vms_reserved_memory_mib",), True, "gpu_vms_reserved_memory_mib", "the boolean", None),
    Case("mixed-false-string", ("gpu_vms_mixed_vgpu_types",), "false", "gpu_vms_mixed_vgpu_types", "write false", None),
    Case("mixed-yes-string", ("gpu_vms_mixed_vgpu_types",), "yes", "gpu_vms_mixed_vgpu_types", "write true", None),
    Case("mixed-number", ("gpu_vms_mixed_vgpu_types",), 2, "gpu_vms_mixed_vgpu_types", "true or false", None),
    Case("reserved-cpus-bomb", ("gpu_vms_reserved_cpus",), "0-4000000000", "gpu_vms_reserved_cpus", "CPU number"),
    Case("reserved-cpus-list", ("gpu_vms_reserved_cpus",), [0, 1], "gpu_vms_reserved_cpus", "cpulist", None),
    Case("vm-memory-quoted", vm_field("memory_mib"), "1024", "gpu_vms_list[0].memory_mib", "write 1024 without"),
    Case("vm-memory-float", vm_field("memory_mib"), 1e30, "gpu_vms_list[0].memory_mib", "whole number"),
    Case("vm-vcpus-zero", vm_field("vcpus"), 0, "gpu_vms_list[0].vcpus", "out of range"),
    Case("vm-vcpus-huge", vm_field("vcpus"), 10**9, "gpu_vms_list[0].vcpus", "out of range"),
    Case("vm-numa-negative", vm_field("numa_node"), -1, "gpu_vms_list[0].numa_node", "out of range"),
    Case("vm-pin-string", vm_field("pin"), "false", "gpu_vms_list[0].pin", "write false without quotes"),
    Case("vm-autostart-string", vm_field("autostart"), "yes", "gpu_vms_list[0].autostart", "write true"),
    Case("vm-hide-kvm-string", vm_field("hide_kvm"), "no", "gpu_vms_list[0].hide_kvm", "write false"),
    Case("vm-hugepages-string", vm_field("hugepages"), "true", "gpu_vms_list[0].hugepages", "one of auto, yes"),
    Case("vm-disk-negative", vm_field("disk", "size_gib"), -1, "gpu_vms_list[0].disk.size_gib", "out of range"),
    Case(
        "vm-vgpu-type-quoted",
        vm_field("vfs"),
        [{"address": "0000:00:01.0", "vgpu_type": "557"}],
        "gpu_vms_list[0].vfs[0].vgpu_type",
        "whole number",
    ),
    # CPU lists
    Case("cpuset-bomb", vm_field("cpuset"), "0-4000000000", "gpu_vms_list[0].cpuset", "is not a CPU number"),
    Case("cpuset-past-host", vm_field("cpuset"), "4000", "gpu_vms_list[0].cpuset", "outside this host's CPUs"),
    Case("cpuset-many-ranges", vm_field("cpuset"), ",".join(["0-8191"] * 2000), "gpu_vms_list[0].cpuset", "long"),
    Case("cpuset-twice", vm_field("cpuset"), [1, 1], "gpu_vms_list[0].cpuset", "names a CPU twice"),
    Case("cpuset-bools", vm_field("cpuset"), [True], "gpu_vms_list[0].cpuset[0]", "not a CPU number"),
    Case("cpuset-reversed", vm_field("cpuset"), "1-0", "gpu_vms_list[0].cpuset", "outside"),
    # names and free text
    Case("name-newline", vm_field("name"), "vm-a\n", "gpu_vms_list[0].name", "non-printable character"),
    Case("name-slash", vm_field("name"), "../vm-a", "gpu_vms_list[0].name", "not a valid VM name"),
    Case("name-space", vm_field("name"), "vm-a ", "gpu_vms_list[0].name", "not a valid VM name"),
    Case("name-long", vm_field("name"), "a" * 64, "gpu_vms_list[0].name", "not a valid VM name"),
    Case("name-number", vm_field("name"), 123, "gpu_vms_list[0].name", "quote it"),
    Case("name-markup", vm_field("name"), "[/x]", "gpu_vms_list[0].name", "not a valid VM name"),
    Case("network-control", vm_field("network"), "de\x01f", "gpu_vms_list[0].network", "non-printable character"),
    Case("network-space", vm_field("network"), "my net", "gpu_vms_list[0].network", "not a valid network"),
    Case("machine-control", vm_field("machine"), "q35\x07", "gpu_vms_list[0].machine", "non-printable character"),
    Case("machine-injection", vm_field("machine"), "q35' x='y", "gpu_vms_list[0].machine", "not a valid machine"),
    Case("cmdline-escape", vm_field("boot", "cmdline"), "a\x1b[2Jb", "gpu_vms_list[0].boot.cmdline", "non-printable"),
    Case(
        "cmdline-newline",
        vm_field("boot", "cmdline"),
        "quiet\ninit=/x",
        "gpu_vms_list[0].boot.cmdline",
        "non-printable",
    ),
    Case("cmdline-long", vm_field("boot", "cmdline"), "x" * 5000, "gpu_vms_list[0].boot.cmdline", "more than 2048"),
    Case("kernel-relative", vm_field("boot", "kernel"), "vmlinuz", "gpu_vms_list[0].boot.kernel", "absolute"),
    Case("kernel-dotdot", vm_field("boot", "kernel"), "/boot/../etc/shadow", "gpu_vms_list[0].boot.kernel", "normal"),
    Case("disk-nul", vm_field("disk", "base"), "/var/x\x00y", "gpu_vms_list[0].disk.base", "non-printable character"),
    Case("user-newline", vm_field("cloud_init", "user"), "root\n", "gpu_vms_list[0].cloud_init.user", "non-printable"),
    Case(
        "package-injection",
        vm_field("cloud_init", "packages"),
        ["htop; rm -rf /"],
        "gpu_vms_list[0].cloud_init.packages[0]",
        "not a valid package",
    ),
    Case("vendor-id-long", vm_field("vendor_id"), "x" * 13, "gpu_vms_list[0].vendor_id", "not a valid vendor_id"),
    Case(
        "template",
        vm_field("cloud_init", "ssh_authorized_keys"),
        ["{{ lookup('file', '~/.ssh/id.pub') }}"],
        "gpu_vms_list[0].cloud_init.ssh_authorized_keys[0]",
        "Jinja template",
    ),
    # SSH keys
    Case(
        "key-two-lines",
        vm_field("cloud_init", "ssh_authorized_keys"),
        [KEY + "\n" + ssh_public_key("intruder")],
        "gpu_vms_list[0].cloud_init.ssh_authorized_keys[0]",
        "more than one line",
    ),
    Case(
        "key-options",
        vm_field("cloud_init", "ssh_authorized_keys"),
        ['command="/bin/sh" ' + KEY],
        "gpu_vms_list[0].cloud_init.ssh_authorized_keys[0]",
        "does not start with a key type",
    ),
    Case(
        "key-not-base64",
        vm_field("cloud_init", "ssh_authorized_keys"),
        ["ssh-ed25519 AAAA!!!! x"],
        "gpu_vms_list[0].cloud_init.ssh_authorized_keys[0]",
        "not base64",
    ),
    Case(
        "key-type-mismatch",
        vm_field("cloud_init", "ssh_authorized_keys"),
        ["ssh-rsa " + KEY.split()[1]],
        "gpu_vms_list[0].cloud_init.ssh_authorized_keys[0]",
        "not a ssh-rsa key",
    ),
    Case(
        "keys-not-a-list",
        vm_field("cloud_init", "ssh_authorized_keys"),
        KEY,
        "gpu_vms_list[0].cloud_init.ssh_authorized_keys",
        "must be a list",
    ),
    # MACs, UUIDs, PCI addresses, ROMs
    Case("mac-multicast", vm_field("mac"), "01:00:5e:00:00:01", "gpu_vms_list[0].mac", "multicast"),
    Case("mac-broadcast", vm_field("mac"), "ff:ff:ff:ff:ff:ff", "gpu_vms_list[0].mac", "multicast"),
    Case("mac-zero", vm_field("mac"), "00:00:00:00:00:00", "gpu_vms_list[0].mac", "not a NIC's address"),
    Case("mac-unquoted", vm_field("mac"), yaml_reads("52:54:00:12:34:56"), "gpu_vms_list[0].mac", "quote"),
    Case("mac-trailing-newline", vm_field("mac"), "52:54:00:12:34:56\n", "gpu_vms_list[0].mac", "non-printable"),
    Case("uuid-braces", vm_field("mdevs", 0, "uuid"), "{" + UUID + "}", "gpu_vms_list[0].mdevs[0].uuid", "UUID"),
    Case("uuid-urn", vm_field("mdevs", 0, "uuid"), "urn:uuid:" + UUID, "gpu_vms_list[0].mdevs[0].uuid", "UUID"),
    Case("mdev-type-path", vm_field("mdevs", 0, "type"), "../../../x", "gpu_vms_list[0].mdevs[0].type", "valid type"),
    Case("mdev-parent-path", vm_field("mdevs", 0, "parent"), "../mtty", "gpu_vms_list[0].mdevs[0].parent", "valid"),
    Case("gpu-unquoted", vm_field("gpus"), [yaml_reads("0000:41:00.0")], "gpu_vms_list[0].gpus[0]", "quote"),
    Case("gpu-newline", vm_field("gpus"), ["0000:41:00.0\n"], "gpu_vms_list[0].gpus[0]", "non-printable character"),
    Case(
        "rom-shadow",
        vm_field("gpus"),
        [{"address": "0000:41:00.0", "rom": "/etc/shadow"}],
        "gpu_vms_list[0].gpus[0].rom",
        f"is not in {ROM_DIR}",
    ),
    Case(
        "rom-dotdot",
        vm_field("gpus"),
        [{"address": "0000:41:00.0", "rom": f"{ROM_DIR}/../../../../etc/shadow"}],
        "gpu_vms_list[0].gpus[0].rom",
        "normalized",
    ),
    # structure
    Case("nested-junk", vm_field("gpus"), [[[[[1]]]]], "gpu_vms_list[0].gpus[0]", "must be a string"),
    Case("vm-not-mapping", ("gpu_vms_list", 0), "vm-a", "gpu_vms_list[0]", "must be a mapping", None),
    Case("list-not-list", ("gpu_vms_list",), {"name": "vm-a"}, "gpu_vms_list", "must be a list", None),
    Case("too-many-vms", ("gpu_vms_list",), [{"name": f"v{i}"} for i in range(5000)], "gpu_vms_list", "more", None),
    Case("unknown-vm-key", vm_field("memroy_mib"), 1, "gpu_vms_list[0]", "unknown keys memroy_mib"),
    Case("defaults-bad-memory", ("gpu_vms_defaults", "memory_mib"), "lots", "gpu_vms_defaults.memory_mib", "whole"),
    Case("defaults-not-mapping", ("gpu_vms_defaults",), "x", "gpu_vms_defaults", "must be a mapping", None),
    Case("role-variable-typo", ("gpu_vms_mixed_vgpu_type",), True, "gpu_vms_mixed_vgpu_type", "not a variable", None),
    # the vGPU layout (gpu_vgpu's gpus option)
    Case(
        "layout-mig-count-bomb",
        ("gpuprov_gpus",),
        {"0000:41:00.0": {"use": "mig", "mig": {"1g.10gb": 10**12}}},
        "0000:41:00.0: mig: 1g.10gb",
        "out of range",
    ),
    Case(
        "layout-key-unquoted",
        ("gpuprov_gpus",),
        {yaml_reads("0000:41:00.0"): {"use": "mig", "mig": []}},
        "gpuprov_gpus key",
        "quote it",
        module_text="is not a PCI address",
    ),
    Case("layout-key-newline", ("gpuprov_gpus",), {"mtty\n": {"use": "mdev"}}, "gpuprov_gpus key", "not a PCI"),
    Case("layout-uuid-braces", (*LAYOUT_MDEV, "uuid"), "{" + UUID + "}", "mtty: mdevs[0]: uuid", "UUID"),
    Case("layout-type-path", (*LAYOUT_MDEV, "type"), "../../x", "mtty: mdevs[0]: type", "valid type"),
    Case("layout-too-many", LAYOUT_MDEV[:-1], [{"type": "mtty-1"}] * 10000, "mtty: mdevs", "more than 256"),
    Case("layout-use-number", ("gpuprov_gpus", "mtty", "use"), 1, "gpuprov_gpus['mtty']", "use 1 is not one of"),
]


def hostile_doc(case: Case) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    node: Any = doc
    for key in case.path[:-1]:
        node = node[key]
    node[case.path[-1]] = case.value
    return doc


# ---------------------------------------------------------------- gpuprov plan, as a subprocess


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (30, 30))  # a regression fails, it does not hang the suite


def run_plan(path: Path, root: Path, *extra: str) -> tuple[int, str, str, float]:
    """``gpuprov plan`` in a child with 1 GiB of address space: (rc, stdout, stderr, CPU seconds)."""
    out, cpu = run_timed_by_cpu(
        [sys.executable, "-m", "gpuprov", "plan", str(path), "--root", str(root), *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        preexec_fn=_limits,
        timeout=120,
        check=False,
    )
    return out.returncode, out.stdout, out.stderr, cpu


@pytest.fixture(scope="module")
def mtty_root(tmp_path_factory: pytest.TempPathFactory, host_root) -> Path:
    return host_root("mtty-mdev")


def write_yaml(path: Path, doc: Any) -> Path:
    path.write_text(yaml.safe_dump(doc, allow_unicode=False))
    return path


def test_the_base_document_plans_cleanly(mtty_root, tmp_path) -> None:
    """The hostile cases are one change each from a document that is fine."""
    rc, out, err, _cpu = run_plan(write_yaml(tmp_path / "host.yml", BASE), mtty_root)
    assert rc == 0, out + err
    host_vars, problems = validate_host_vars(copy.deepcopy(BASE), cpu_limit=2)
    assert problems == [] and host_vars is not None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_refuses_a_hostile_field(case: Case, mtty_root, tmp_path) -> None:
    before = tree_digest(mtty_root)
    rc, out, err, cpu = run_plan(write_yaml(tmp_path / "host.yml", hostile_doc(case)), mtty_root)
    assert rc == 2, out + err
    assert "Traceback" not in err and out == ""
    lines = err.splitlines()
    named = [i for i, line in enumerate(lines) if line.startswith(f"  {case.field}")]
    assert any(case.text in lines[i] + lines[i + 1] for i in named), err  # the problem, then its fix
    assert all(lines[i + 1].startswith("    fix: ") for i in named), err
    assert cpu < CPU_SECONDS, f"{cpu:.1f} s of CPU"
    assert tree_digest(mtty_root) == before


def _bomb(levels: int = 9, width: int = 9) -> str:
    text = "a0: &a0 [" + ",".join(["x"] * width) + "]\n"
    for n in range(1, levels):
        text += f"a{n}: &a{n} [" + ",".join([f"*a{n - 1}"] * width) + "]\n"
    return text + f"gpu_vms_list: *a{levels - 1}\n"


def _merge_bomb() -> str:
    text = "k0: &k0 {" + ", ".join(f"x{i}: 1" for i in range(50)) + "}\n"
    for n in range(1, 6):
        text += f"k{n}: &k{n} {{<<: [" + ", ".join([f"*k{n - 1}"] * 20) + "]}\n"
    return text + "gpu_vms_list: [*k5]\n"


YAML_CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("alias-bomb", lambda p: p.write_text(_bomb()), "aliases are expanded"),
    ("merge-key-bomb", lambda p: p.write_text(_merge_bomb()), "aliases are expanded"),
    ("recursive-alias", lambda p: p.write_text("gpu_vms_list: &x [*x]\n"), "refers to itself"),
    ("deep-nesting", lambda p: p.write_text("gpu_vms_list: " + "[" * 100000 + "]" * 100000 + "\n"), "nested more"),
    ("deep-block-nesting", lambda p: p.write_text("".join(" " * i + f"k{i}:\n" for i in range(200)) + "\n"), "nested"),
    ("not-utf8", lambda p: p.write_bytes(b"gpu_vms_list:\n  - name: a\xff\n"), "byte 0xff at offset 25"),
    ("utf16", lambda p: p.write_bytes("gpu_vms_list: []\n".encode("utf-16")), "not UTF-8: byte 0xff at offset 0"),
    ("too-big", lambda p: p.write_text("# " + "x" * MAX_BYTES + "\n"), "more than 1048576"),
    ("huge-integer", lambda p: p.write_text("gpu_vms_list: [{name: a, memory_mib: " + "9" * 6000 + "}]\n"), "digits"),
    ("python-tag", lambda p: p.write_text("gpu_vms_list: !!python/object/apply:os.system ['id']\n"), "valid YAML"),
    ("two-documents", lambda p: p.write_text("gpu_vms_list: []\n---\ngpu_vms_list: []\n"), "single document"),
    ("control-character", lambda p: p.write_text("gpu_vms_list: [{name: a\x07}]\n"), "special characters"),
    ("empty", lambda p: p.write_text(""), "has no gpuprov_host"),
    ("junk", lambda p: p.write_bytes(random.Random(11).randbytes(4096)), "gpuprov: error:"),
    ("fifo", lambda p: os.mkfifo(p), "is not a regular file"),
    ("directory", lambda p: p.mkdir(), "is not a regular file"),
]


@pytest.mark.parametrize(("name", "make", "text"), YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_plan_reads_hostile_yaml_within_bounds(name, make, text, mtty_root, tmp_path) -> None:
    path = tmp_path / "host.yml"
    make(path)
    rc, out, err, cpu = run_plan(path, mtty_root)
    assert rc == 2 and "Traceback" not in err and out == "", err[-2000:]
    assert text in err, err[-2000:]
    assert cpu < CPU_SECONDS, f"{cpu:.1f} s of CPU"


def test_anchors_and_merge_keys_are_fine(mtty_root, tmp_path) -> None:
    """Bounded, not banned: host_vars files share settings through anchors and merge keys."""
    path = tmp_path / "host.yml"
    path.write_text(
        "gpu_vms_reserved_memory_mib: 0\n"
        'gpu_vms_reserved_cpus: ""\n'
        "common: &common {accel: tcg, firmware: bios, memory_mib: 128, network: default}\n"
        "gpu_vms_list:\n"
        "  - {<<: *common, name: vm-a}\n"
        "  - {<<: *common, name: vm-b}\n"
    )
    rc, out, err, _cpu = run_plan(path, mtty_root, "--json")
    assert rc == 0, out + err
    assert [vm["name"] for vm in yaml.safe_load(out)["vms"]] == ["vm-a", "vm-b"]


def test_cli_overrides_meet_the_same_rules(mtty_root, tmp_path) -> None:
    path = write_yaml(tmp_path / "host.yml", BASE)
    rc, _out, err, _cpu = run_plan(path, mtty_root, "--reserved-memory-mib", "-5", "--reserved-cpus", "0-99999")
    assert rc == 2 and "--reserved-memory-mib: -5 is out of range" in err and "  --reserved-cpus: " in err


# ---------------------------------------------------------------- the modules, in process


def module_names(message: str) -> str:
    """How gpu_vm names what a host_vars file calls gpu_vms_list[0].x, gpu_vms_defaults.x, gpu_vms_reserved_x."""
    return message.replace("gpu_vms_list[0]", "vm").replace("gpu_vms_defaults", "defaults").replace("gpu_vms_", "")


@pytest.fixture
def staged_mtty(mtty_root, tmp_path) -> Path:
    dest = tmp_path / "root"
    shutil.copytree(mtty_root, dest, symlinks=True)
    return dest


def gpu_vm_args(doc: dict[str, Any], root: Path, storage: Path) -> dict[str, Any]:
    vms = doc["gpu_vms_list"]
    return {
        "vm": vms[0] if isinstance(vms, list) and vms and isinstance(vms[0], dict) else {"name": "vm-a"},
        "defaults": doc.get("gpu_vms_defaults") if isinstance(doc.get("gpu_vms_defaults"), dict) else {},
        "reserved_memory_mib": doc["gpu_vms_reserved_memory_mib"],
        "reserved_cpus": doc["gpu_vms_reserved_cpus"],
        "mixed_vgpu_types": doc["gpu_vms_mixed_vgpu_types"],
        "root": str(root),
        "storage_dir": str(storage),
    }


MODULE_CASES = [c for c in CASES if c.module is not None]


@pytest.mark.parametrize("case", MODULE_CASES, ids=[c.id for c in MODULE_CASES])
def test_modules_refuse_the_same_field(case: Case, staged_mtty, tmp_path) -> None:
    doc = hostile_doc(case)
    before = tree_digest(tmp_path)
    if case.path[0] == "gpuprov_gpus":
        result = run_in_process("gpu_vgpu", {"gpus": doc["gpuprov_gpus"], "root": str(staged_mtty)})
        field = case.field
    else:
        result = run_in_process("gpu_vm", gpu_vm_args(doc, staged_mtty, tmp_path / "vms"))
        field = module_names(case.field)
    assert result["failed"] and result["msg"].startswith("refused, nothing changed: "), result.get("msg")
    text = case.module_text or case.text
    named = [r for r in result["refusals"] if r["message"].startswith(field)]
    assert any(text in r["message"] + str(r["fix"]) for r in named), result["refusals"]
    assert result["plan"] == [] and tree_digest(tmp_path) == before


@pytest.mark.parametrize(
    ("option", "value", "text"),
    [
        ("reserved_memory_mib", "abc", "unable to convert to int"),
        ("mixed_vgpu_types", "maybe", "unable to convert to bool"),
        ("reserved_memory_mib", -1, "reserved_memory_mib: -1 is out of range"),
        ("reserved_cpus", "0-4000000000", "reserved_cpus: '0-4000000000' is not a CPU number"),
        ("wait_for_address", -5, "wait_for_address: -5 is out of range"),
        ("shutdown_timeout", 10**9, "shutdown_timeout: 1000000000 is out of range"),
        ("storage_dir", "/var/lib/../../etc", "storage_dir: '/var/lib/../../etc' is not an absolute, normalized"),
        ("uri", "qemu:///system\n", "uri: 'qemu:///system\\n' holds the non-printable character"),
    ],
)
def test_ansible_types_top_level_options(option, value, text, staged_mtty, tmp_path) -> None:
    """Top-level options are typed by Ansible first ("false" is false for a bool option, as
    with -e on the command line), then by the same validator; inside vm/defaults/host_vms/gpus
    the strict rules apply as in a host_vars file."""
    before = tree_digest(tmp_path)
    result = run_in_process("gpu_vm", {**gpu_vm_args(BASE, staged_mtty, tmp_path / "vms"), option: value})
    assert result["failed"] and text in result["msg"], result.get("msg")
    assert tree_digest(tmp_path) == before


def test_gpu_vgpu_options(staged_mtty, tmp_path) -> None:
    before = tree_digest(tmp_path)
    result = run_in_process(
        "gpu_vgpu", {"gpus": {}, "scheduler": "equal_share", "scheduler_timeslice_ms": 31, "root": str(staged_mtty)}
    )
    assert result["failed"] and "scheduler_timeslice_ms: 31 is out of range" in result["msg"]
    assert tree_digest(tmp_path) == before


def test_the_quoted_false_no_longer_skips_the_mixed_type_refusal(tmp_path) -> None:
    """Before: bool("false") is True, so mixed vGPU types on one NVIDIA GPU passed plan."""
    facts = nvidia_vgpu_host(tmp_path / "root")
    vms = [
        {"name": "a", "memory_mib": 128, "mdevs": [{"parent": "0000:41:00.0", "type": "nvidia-474"}]},
        {"name": "b", "memory_mib": 128, "mdevs": [{"parent": "0000:41:00.0", "type": "nvidia-475"}]},
    ]
    refused = plan_host(facts, vms, HostSettings(reserved_memory_mib=0, mixed_vgpu_types="false"))  # type: ignore[arg-type]
    assert [r.message for r in refused.refusals] == ["mixed_vgpu_types: must be a boolean, not the string 'false'"]
    _hv, problems = validate_host_vars({"gpu_vms_mixed_vgpu_types": "false", "gpu_vms_list": vms})
    assert any("write false without quotes" in (r.fix or "") for r in problems)


def test_every_check_agrees_between_plan_and_module(staged_mtty, tmp_path) -> None:
    """The same entry: plan's verdict and gpu_vm's are the same, field for field."""
    for case in MODULE_CASES:
        if case.path[0] == "gpuprov_gpus":
            plan_found = validate_host_vars(hostile_doc(case), cpu_limit=2)[1]
            module_found = validate_gpu_vgpu_options({"gpus": hostile_doc(case)["gpuprov_gpus"]})
            if case.module_text is None:  # JSON keys are strings: an unquoted address arrives as one
                assert [r.message for r in plan_found] == [r.message for r in module_found], case.id
            continue
        _hv, plan_found = validate_host_vars(hostile_doc(case), cpu_limit=2)
        args = gpu_vm_args(hostile_doc(case), staged_mtty, tmp_path / "vms")
        _given, module_found = validate_gpu_vm_options({**args, "state": "running"}, cpu_limit=2)
        assert {module_names(r.message) for r in plan_found} == {r.message for r in module_found}, case.id


# ---------------------------------------------------------------- single rules


def test_cpu_lists_are_bounded_before_they_are_expanded() -> None:
    p = Problems()
    assert cpu_list(p, "x", "0-3,8") == [0, 1, 2, 3, 8] and cpu_list(p, "x", [5, 6]) == [5, 6] and not p
    assert cpu_list(p, "x", "") == [] and cpu_list(p, "x", 3) == [3] and not p
    assert cpu_list(p, "x", "0-8191") == list(range(8192)) and not p
    for bad in ("0-8192", "0-99999999999999999999", "3-1", "1,,2", "a", "0-1,0-1", [-1], ["0"], True, 1.5):
        assert cpu_list(Problems(), "x", bad) is None, bad
    assert cpu_list(Problems(), "x", "0-15", cpu_limit=16) and cpu_list(Problems(), "x", "16", cpu_limit=16) is None


def test_ssh_keys_of_every_known_type_pass_and_their_comments_stay() -> None:
    for key_type in ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "sk-ssh-ed25519@openssh.com"):
        key = ssh_public_key("ops team key", key_type)
        assert ssh_key(Problems(), "k", "  " + key + "\n") == key


def test_rom_files_must_be_regular_files_inside_the_rom_directory(tmp_path) -> None:
    roms = tmp_path / ROM_DIR.lstrip("/")
    roms.mkdir(parents=True)
    (roms / "good.rom").write_bytes(b"\x55\xaa")
    (roms / "alias.rom").symlink_to("good.rom")
    (roms / "absolute.rom").symlink_to(f"{ROM_DIR}/good.rom")  # absolute: resolved as if the root were /
    (roms / "shadow.rom").symlink_to("/etc/shadow")
    (roms / "up.rom").symlink_to("../../../../etc/hostname")
    (roms / "loop.rom").symlink_to("loop.rom")
    (roms / "dir.rom").mkdir()
    os.mkfifo(roms / "fifo.rom")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/shadow").write_text("root:x:\n")
    for name in ("good", "alias", "absolute"):
        assert rom_file_problem(str(tmp_path), f"{ROM_DIR}/{name}.rom") is None, name
    expected = {
        "shadow": "leads out of",
        "up": "not found",
        "loop": "symlink loop",
        "dir": "not a regular file",
        "fifo": "not a regular file",
        "missing": "not found",
    }
    for name, text in expected.items():
        assert text in (rom_file_problem(str(tmp_path), f"{ROM_DIR}/{name}.rom") or ""), name


def test_a_rom_file_is_checked_on_the_host(host_root, tmp_path) -> None:
    root = tmp_path / "root"
    shutil.copytree(host_root("gpu-audio"), root, symlinks=True)
    vm = {"name": "g", "memory_mib": 128, "gpus": [{"address": "0000:01:00.0", "rom": f"{ROM_DIR}/vbios.rom"}]}
    path = write_yaml(tmp_path / "vms.yml", {"gpu_vms_reserved_memory_mib": 0, "gpu_vms_list": [vm]})
    rc, out, err, _cpu = run_plan(path, root)
    assert rc == 3 and f"VM g: ROM file {ROM_DIR}/vbios.rom not found" in out, out + err
    (root / ROM_DIR.lstrip("/")).mkdir(parents=True)
    (root / ROM_DIR.lstrip("/") / "vbios.rom").write_bytes(b"\x55\xaa")
    rc, out, err, _cpu = run_plan(path, root)
    assert rc == 0, out + err


def test_the_role_variables_are_the_roles() -> None:
    defaults = yaml.safe_load((REPO / "roles/gpu_vms/defaults/main.yml").read_text())
    assert set(GPU_VMS_VARIABLES) == set(defaults)


@pytest.mark.parametrize("path", sorted(REPO.glob("inventories/*/host_vars/*.yml")), ids=lambda p: p.name)
def test_the_shipped_inventories_pass(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    if "gpu_vms_list" not in doc:
        doc["gpu_vms_list"] = []
    _hv, problems = validate_host_vars(doc)
    assert problems == []
