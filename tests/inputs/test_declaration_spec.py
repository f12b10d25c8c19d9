"""One spec per input (issue #27): the host declaration's published JSON Schema
(docs/reference/gpuprov-host.schema.json, read by the ``jsonschema`` package), gpuprov's validator
(``gpuprov.inputs.declaration.check``, which evaluates the same schema) and the resolver
(``gpuprov.model.resolve.resolve``, what ``gpuprov plan`` and the modules run) give the same
verdict on the same documents: valid ones, hostile ones written by hand (``memory_mib: "lots"``,
negative and huge numbers, wrong types at every level, unknown keys), documents generated from
the schema and mutated (hypothesis, the fixed budget of tests/conftest.py), and every example the
README, the guides and the inventories give. What a JSON Schema cannot say (names used twice,
values merged with vm_defaults...) is the resolver's alone, named in :data:`CROSS`, as
docs/reference/host-model.md lists it. The declaration's version: 1, or refused naming it."""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.cli.main import main
from gpuprov.facts.host import HostFacts, cpu_count, gather
from gpuprov.facts.sysfs import Sysfs
from gpuprov.inputs import declaration as decl
from gpuprov.inputs.declaration import NO_VERSION, ROOT, SCHEMA, check
from gpuprov.inputs.schema_eval import KEYWORDS
from gpuprov.inputs.validate import SSH_KEY_TYPES, Problems, cpu_list, path_text, ssh_key
from gpuprov.model.resolve import resolve
from tests.model.test_host_model import CONSOLE, H100, SRIOV, VGPU, build_host

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = json.loads((REPO / "docs/reference/gpuprov-host.schema.json").read_text(encoding="utf-8"))

# YAML's integers: 1.0 is a float there, and gpuprov takes a whole number only written as one. For
# JSON's number model 1.0 is the integer 1: the stock validator takes it (the one difference).
_YAML_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
)
THEIRS = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_YAML_TYPES)(PUBLISHED)
STOCK = jsonschema.Draft202012Validator(PUBLISHED)

# What the schema cannot say, so the resolver alone refuses it (docs/reference/host-model.md,
# "What the schema cannot say"): each a fragment of its message.
CROSS = {
    "the name is used twice": "a GPU entry's name given twice",
    "no layout": "a layout named but not declared",
    "needs a base image or an existing disk": "a VM's disk, with vm_defaults merged",
    "needs a kernel": "a VM's boot, with vm_defaults merged",
    "CPUs for": "a cpuset: one CPU per vCPU",
    "is outside": "a cpulist's range: low-high, within the host's CPUs",
    "names a CPU twice": "a cpulist: each CPU once",
    "names more CPUs than": "a cpulist: each CPU once",
    "is not a CPU number within": "a cpuset's CPU within the host's",
    "joins": "nvlink_clique: true joins two GPUs or more",
    "entries, more than": "what a VM's names stand for, at most 64 devices",
    "may take too": "a layout file's entries: each GPU once",
    "repeats the profile": "a layout file's profiles: each once",
    "mixes time-sliced and MIG-backed": "a layout file's vGPU types: one kind per GPU",
    "vGPUs of one GPU, more than": "a layout file's vGPU counts together",
    "GPU entries": "a layout file's entries together: at most 65,536 GPU entries",
}


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> HostFacts:
    return gather(Sysfs(str(build_host(tmp_path_factory.mktemp("spec-host")))))


def ours(doc: Any) -> bool:
    return not check(doc, ROOT)


def theirs(doc: Any) -> bool:
    return THEIRS.is_valid(doc)


def problems(doc: Any, facts: HostFacts) -> list[str]:
    """What ``gpuprov plan`` calls the file's own problems (exit 2), each as message and fix."""
    model = resolve(doc, facts, cpu_limit=cpu_count(facts))
    return [f"{r.message} (fix: {r.fix})" for r in model.problems]


def beyond_the_schema(found: list[str]) -> list[str]:
    return [m for m in found if not any(fragment in m for fragment in CROSS)]


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICT0KHzkODcN8JRMbXKJ2FhJhcSvMylXYFtKYKWZlyPQ admin@example"


def base() -> dict[str, Any]:
    """A declaration using every part of the schema, valid on the test host."""
    return {
        "gpuprov_host": {
            "version": 1,
            "gpus": [
                {"name": "console", "address": CONSOLE, "use": "host", "expect": "10de:1eb1"},
                {"name": "train", "select": "10de:2330", "use": "passthrough"},
                {"name": "a100", "address": VGPU, "use": "mdev", "instances": {"nvidia-474": 2}},
                {"name": "sr", "address": SRIOV, "use": "sriov_vgpu", "instances": [{"type": 557, "name": "sr-a"}]},
                {"name": "m", "select": {"index": 3}, "use": "mig", "mig": {"1g.10gb": 7}},
            ],
            "vm_defaults": {
                "network": "default",
                "disk": {"base": "/var/lib/libvirt/images/debian.qcow2", "size_gib": 20},
                "cloud_init": {"user": "gpuadmin", "ssh_authorized_keys": [KEY], "packages": ["curl=8.0"]},
            },
            "vms": [
                {
                    "name": "train-01",
                    "state": "running",
                    "memory_mib": 4096,
                    "vcpus": 2,
                    "firmware": "efi",
                    "accel": "kvm",
                    "machine": "pc-q35-8.0",
                    "gpus": ["train[0]", {"name": "train[1]", "rom": "off"}],
                    "numa_node": 0,
                    "cpuset": "2-3",
                    "pin": True,
                    "hugepages": "auto",
                    "hide_kvm": False,
                    "vendor_id": "gpuprov",
                    "mac": "52:54:00:12:34:56",
                    "autostart": True,
                    "nvlink_clique": True,
                },
                {"name": "nb", "gpus": ["a100.0"], "boot": {"kernel": "/boot/vmlinuz", "cmdline": "console=ttyS0"}},
                {"name": "sr-vm", "gpus": ["sr-a"], "cpuset": [4], "vcpus": 1, "network": None},
            ],
            "reserved_cpus": "0-1",
            "reserved_memory_mib": 1024,
            "mixed_vgpu_types": False,
        }
    }


def put(doc: Any, path: str, value: Any) -> Any:
    """``doc`` with ``value`` at ``path`` (gpuprov_host.vms[0].memory_mib); ``...=DELETE`` removes it."""
    doc = copy.deepcopy(doc)
    parts = [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]
    node = doc
    for part in parts[:-1]:
        node = node[part]
    if value is DELETE:
        del node[parts[-1]]
    else:
        node[parts[-1]] = value
    return doc


DELETE = object()
VM = "gpuprov_host.vms[0]"
GPU = "gpuprov_host.gpus[2]"
MIG_PARTED = {
    "version": "v1",
    "mig-configs": {
        "all-1g": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
        "split": [
            {"devices": [0, 1], "mig-enabled": False},
            {"devices": [2], "mig-enabled": True, "mig-devices": {"2c.2g.20gb": 3}},
        ],
        "a100": [{"devices": "all", "device-filter": ["0x20B010DE"], "mig-enabled": True, "mig-devices": {}}],
    },
}
VGPU_DEVICE_MANAGER = {
    "version": "v1",
    "vgpu-configs": {"A100-4C": [{"devices": "all", "vgpu-devices": {"A100-4C": 10}}]},
}


def layouts(value: Any, host: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"gpuprov_layouts": value, "gpuprov_host": host or {"version": 1, "layout": next(iter(_configs(value)))}}


def _configs(value: Any) -> dict[str, Any]:
    for key in ("mig-configs", "vgpu-configs"):
        if isinstance(value, dict) and key in value:
            return value[key]
    return value


VALID = {
    "the base": base(),
    "nulls for a VM's optional keys": put(
        base(),
        VM,
        {"name": "n"}
        | {k: None for k in ("state", "memory_mib", "vcpus", "firmware", "accel", "machine", "gpus", "numa_node")}
        | {k: None for k in ("cpuset", "pin", "hugepages", "hide_kvm", "vendor_id", "network", "mac")}
        | {"disk": {"base": None, "path": "/var/lib/libvirt/images/n.qcow2", "size_gib": None}, "boot": None}
        | {"autostart": None, "nvlink_clique": None, "cloud_init": None},
    ),
    "a ROM file and a rom boolean": put(
        base(),
        f"{VM}.gpus",
        [{"name": "train[0]", "rom": "/var/lib/libvirt/roms/a.rom"}, {"name": "train[1]", "rom": True}],
    ),
    "a trailing-newline key (YAML's |)": put(
        base(), "gpuprov_host.vm_defaults.cloud_init.ssh_authorized_keys", [KEY + "\n"]
    ),
    "the host settings' other forms": put(
        put(base(), "gpuprov_host.reserved_cpus", 3), "gpuprov_host.reserved_memory_mib", None
    ),
    "an empty cpulist": put(base(), "gpuprov_host.reserved_cpus", ""),
    "other variables beside it": base() | {"iommu_host_allow_reboot": True, "gpu_vms_install": False, 1: 2},
    "named layouts": layouts({"h100.x": {"gpus": [{"name": "t", "select": "all", "use": "passthrough"}]}}),
    "a mig-parted file as layouts": layouts(MIG_PARTED),
    "a vgpu-device-manager file as layouts": layouts(VGPU_DEVICE_MANAGER),
    "a type by numeric ID": put(base(), f"{GPU}.instances", {"474": 1}),
    "an mdev parent by name": put(base(), GPU, {"name": "mtty", "address": "mtty", "use": "mdev"}),
    "an 8-digit PCI domain": put(base(), "gpuprov_host.gpus[0].address", "10000:01:00.0"),
    "a MAC in upper case": put(base(), f"{VM}.mac", "52:54:00:AB:CD:EF"),
    "a path with a trailing slash": put(base(), f"{VM}.disk", {"path": "/var/lib/libvirt/images/x/"}),
}

HOSTILE = {
    # a VM's keys, each against the rule parse_vm applies
    "memory_mib: lots": (f"{VM}.memory_mib", "lots"),
    "memory_mib negative": (f"{VM}.memory_mib", -1),
    "memory_mib huge": (f"{VM}.memory_mib", 10**30),
    "memory_mib below 64": (f"{VM}.memory_mib", 63),
    "memory_mib a float": (f"{VM}.memory_mib", 4096.5),
    "memory_mib a boolean": (f"{VM}.memory_mib", True),
    "vcpus 0": (f"{VM}.vcpus", 0),
    "vcpus quoted": (f"{VM}.vcpus", "4"),
    "numa_node 1024": (f"{VM}.numa_node", 1024),
    "state paused": (f"{VM}.state", "paused"),
    "firmware uefi": (f"{VM}.firmware", "uefi"),
    "accel hvf": (f"{VM}.accel", "hvf"),
    "machine i440fx": (f"{VM}.machine", "pc-i440fx-8.0"),
    "machine upper case": (f"{VM}.machine", "Q35"),
    "name with a space": (f"{VM}.name", "bad name"),
    "name empty": (f"{VM}.name", ""),
    "name too long": (f"{VM}.name", "x" * 64),
    "name with a final newline": (f"{VM}.name", "train\n"),
    "name a number": (f"{VM}.name", 5),
    "name missing": (f"{VM}.name", DELETE),
    "mac multicast": (f"{VM}.mac", "01:00:5e:00:00:01"),
    "mac zero": (f"{VM}.mac", "00:00:00:00:00:00"),
    "mac short": (f"{VM}.mac", "52:54:00:12:34"),
    "mac a number": (f"{VM}.mac", 525400123456),
    "cpuset junk": (f"{VM}.cpuset", "0-3,x"),
    "cpuset negative": (f"{VM}.cpuset", -1),
    "cpuset beyond 8191": (f"{VM}.cpuset", "8192"),
    "cpuset a CPU twice in a list": (f"{VM}.cpuset", [2, 2]),
    "cpuset a boolean": (f"{VM}.cpuset", True),
    "cpuset a list of booleans": (f"{VM}.cpuset", [True, False]),
    "cpuset six digits": (f"{VM}.cpuset", "000002-3"),
    "hugepages always": (f"{VM}.hugepages", "always"),
    "pin quoted": (f"{VM}.pin", "true"),
    "vendor_id too long": (f"{VM}.vendor_id", "toolongvendorid"),
    "network with a slash": (f"{VM}.network", "bad/net"),
    "autostart yes quoted": (f"{VM}.autostart", "yes"),
    "nvlink_clique as lists": (f"{VM}.nvlink_clique", [[H100[0], H100[1]]]),
    "an unknown VM key": (f"{VM}.colour", "blue"),
    "mdevs in a declaration": (f"{VM}.mdevs", []),
    "vfs in a declaration": (f"{VM}.vfs", []),
    "gpus a template": (f"{VM}.gpus", ["{{ gpu }}"]),
    "gpus a number": (f"{VM}.gpus", [5]),
    "gpus 65": (f"{VM}.gpus", ["train"] * 65),
    "gpus rom outside the ROM directory": (f"{VM}.gpus", [{"name": "train", "rom": "/tmp/x.rom"}]),
    "gpus rom maybe": (f"{VM}.gpus", [{"name": "train", "rom": "maybe"}]),
    "gpus an unknown key": (f"{VM}.gpus", [{"name": "train", "bar": 1}]),
    "disk relative": (f"{VM}.disk", {"base": "images/x.qcow2"}),
    "disk with ..": (f"{VM}.disk", {"base": "/var/../etc/shadow"}),
    "disk with //": (f"{VM}.disk", {"base": "//x"}),
    "disk with .": (f"{VM}.disk", {"base": "/a/./b"}),
    "disk with a template": (f"{VM}.disk", {"base": "/x/{{ name }}.qcow2"}),
    "disk with a bell": (f"{VM}.disk", {"base": "/x/\x07"}),
    "disk size 0": (f"{VM}.disk", {"base": "/x", "size_gib": 0}),
    "disk size huge": (f"{VM}.disk", {"base": "/x", "size_gib": 2**21}),
    "disk an unknown key": (f"{VM}.disk", {"base": "/x", "format": "raw"}),
    "disk a string": (f"{VM}.disk", "/x"),
    "cloud_init user Root": (f"{VM}.cloud_init", {"user": "Root"}),
    "cloud_init hostname -x": (f"{VM}.cloud_init", {"hostname": "-x"}),
    "cloud_init a package with a space": (f"{VM}.cloud_init", {"packages": ["bad pkg"]}),
    "ssh key not a key": (f"{VM}.cloud_init", {"ssh_authorized_keys": ["hello"]}),
    "ssh key of another type": (f"{VM}.cloud_init", {"ssh_authorized_keys": ["ssh-rsa " + KEY.split()[1]]}),
    "ssh key bad padding": (f"{VM}.cloud_init", {"ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5A"]}),
    "ssh key two lines": (f"{VM}.cloud_init", {"ssh_authorized_keys": [KEY + "\n" + KEY]}),
    "ssh key a template": (f"{VM}.cloud_init", {"ssh_authorized_keys": [KEY + " {{ who }}"]}),
    "boot relative kernel": (f"{VM}.boot", {"kernel": "vmlinuz"}),
    "boot cmdline two lines": (f"{VM}.boot", {"kernel": "/k", "cmdline": "a\nb"}),
    "boot cmdline too long": (f"{VM}.boot", {"kernel": "/k", "cmdline": "x" * 2049}),
    "vms not a list": ("gpuprov_host.vms", {"name": "a"}),
    "vms 4097": ("gpuprov_host.vms", [{"name": "a"}] * 4097),
    "vm_defaults with a name": ("gpuprov_host.vm_defaults", {"name": "x"}),
    "vm_defaults with gpus": ("gpuprov_host.vm_defaults", {"gpus": []}),
    "vm_defaults memory lots": ("gpuprov_host.vm_defaults", {"memory_mib": "lots"}),
    # the host settings
    "reserved_memory_mib negative": ("gpuprov_host.reserved_memory_mib", -1),
    "reserved_memory_mib huge": ("gpuprov_host.reserved_memory_mib", 2**40),
    "reserved_memory_mib 1G": ("gpuprov_host.reserved_memory_mib", "1G"),
    "reserved_cpus junk": ("gpuprov_host.reserved_cpus", "0-x"),
    "reserved_cpus negative": ("gpuprov_host.reserved_cpus", -1),
    "reserved_cpus a boolean": ("gpuprov_host.reserved_cpus", True),
    "reserved_cpus a list": ("gpuprov_host.reserved_cpus", [0, 1]),
    "reserved_cpus 8192": ("gpuprov_host.reserved_cpus", 8192),
    "mixed_vgpu_types quoted": ("gpuprov_host.mixed_vgpu_types", "yes"),
    "mixed_vgpu_types null": ("gpuprov_host.mixed_vgpu_types", None),
    "an unknown host key": ("gpuprov_host.colour", 1),
    # the version
    "version 2": ("gpuprov_host.version", 2),
    "version '1'": ("gpuprov_host.version", "1"),
    "version 1.5": ("gpuprov_host.version", 1.5),
    "version true": ("gpuprov_host.version", True),
    "version 0": ("gpuprov_host.version", 0),
    "version null": ("gpuprov_host.version", None),
    # GPU entries
    "use hots": (f"{GPU}.use", "hots"),
    "use missing": (f"{GPU}.use", DELETE),
    "name X!": (f"{GPU}.name", "X!"),
    "an unknown GPU key": (f"{GPU}.colour", 1),
    "select every": ("gpuprov_host.gpus[1].select", "every"),
    "select index a boolean": ("gpuprov_host.gpus[1].select", {"index": True}),
    "select index negative": ("gpuprov_host.gpus[1].select", {"index": -1}),
    "select index 1024": ("gpuprov_host.gpus[1].select", {"index": 1024}),
    "select model empty": ("gpuprov_host.gpus[1].select", {"model": ""}),
    "select two keys": ("gpuprov_host.gpus[1].select", {"model": "A", "index": 0}),
    "address short": (f"{GPU}.address", "81:00.0"),
    "address slot 0x20": (f"{GPU}.address", "0000:41:20.0"),
    "address a number": (f"{GPU}.address", 4100),
    "a parent's name for use: host": ("gpuprov_host.gpus[0].address", "mtty"),
    "address and select": ("gpuprov_host.gpus[0].select", "all"),
    "neither address nor select": ("gpuprov_host.gpus[0].address", DELETE),
    "instances for use: host": ("gpuprov_host.gpus[0].instances", {"nvidia-474": 1}),
    "mig for use: passthrough": ("gpuprov_host.gpus[1].mig", {"1g.10gb": 1}),
    "instances count negative": (f"{GPU}.instances", {"nvidia-474": -1}),
    "instances count 257": (f"{GPU}.instances", {"nvidia-474": 257}),
    "instances a type ID 70000": (f"{GPU}.instances", {"70000": 1}),
    "instances a type ID 0": (f"{GPU}.instances", {"0": 1}),
    "instances a type with /": (f"{GPU}.instances", {"a/b": 1}),
    "instances a type in Unicode digits": (f"{GPU}.instances", {"\u00b2": 1}),
    "instance type 0": (f"{GPU}.instances", [{"type": 0}]),
    "instance type 65536": (f"{GPU}.instances", [{"type": 65536}]),
    "instance uuid upper case": (f"{GPU}.instances", [{"type": 1, "uuid": "7B0B3D34-0C4C-4C7E-9A51-2A3F2F7C9E10"}]),
    "instance vf bad": ("gpuprov_host.gpus[3].instances", [{"type": 557, "vf": "0000:b1:00"}]),
    "instance without a type": (f"{GPU}.instances", [{"name": "x"}]),
    "mig count 8": ("gpuprov_host.gpus[4].mig", {"1g.10gb": 8}),
    "expect upper case": ("gpuprov_host.gpus[0].expect", "10DE:1EB1"),
    "gpus 1025": ("gpuprov_host.gpus", [{"name": "x", "select": "all", "use": "host"}] * 1025),
    "gpus a mapping": ("gpuprov_host.gpus", {"name": "x"}),
    "layout with a space": ("gpuprov_host.layout", "a b"),
    # the file
    "gpuprov_host a list": ("gpuprov_host", []),
    "gpuprov_host null": ("gpuprov_host", None),
    "an old variable beside it": ("gpu_vms_list", []),
}

HOSTILE_LAYOUTS = {
    "a layout without gpus": {"a": {}},
    "a layout with an unknown key": {"a": {"gpus": [], "x": 1}},
    "a layout's name with a space": {"a b": {"gpus": []}},
    "a layout not a mapping": {"a": []},
    "mig-parted: version v2": put(MIG_PARTED, "version", "v2"),
    "mig-parted: devices some": put(MIG_PARTED, "mig-configs.all-1g[0].devices", "some"),
    "mig-parted: devices empty": put(MIG_PARTED, "mig-configs.all-1g[0].devices", []),
    "mig-parted: devices negative": put(MIG_PARTED, "mig-configs.all-1g[0].devices", [-1]),
    "mig-parted: an AMD filter": put(MIG_PARTED, "mig-configs.a100[0].device-filter", "0x20B01002"),
    "mig-parted: a subsystem filter": put(MIG_PARTED, "mig-configs.a100[0].device-filter", "0x20B010DE:0x1234"),
    "mig-parted: an empty filter in a list": put(MIG_PARTED, "mig-configs.a100[0].device-filter", [""]),
    "mig-parted: a filter with indices": put(MIG_PARTED, "mig-configs.a100[0].devices", [0]),
    "mig-parted: mig-enabled quoted": put(MIG_PARTED, "mig-configs.all-1g[0].mig-enabled", "true"),
    "mig-parted: profiles while disabled": put(MIG_PARTED, "mig-configs.split[0].mig-devices", {"1g.10gb": 1}),
    "mig-parted: enabled without profiles": put(MIG_PARTED, "mig-configs.all-1g[0].mig-devices", DELETE),
    "mig-parted: a compute-instance profile": put(MIG_PARTED, "mig-configs.split[1].mig-devices", {"2c.3g.20gb": 1}),
    "mig-parted: 8 of a profile": put(MIG_PARTED, "mig-configs.all-1g[0].mig-devices", {"1g.10gb": 8}),
    "mig-parted: an unknown key": put(MIG_PARTED, "mig-configs.all-1g[0].colour", 1),
    "mig-parted: an unknown top key": put(MIG_PARTED, "extra", 1),
    "mig-parted: a config's name with a space": put(
        MIG_PARTED, "mig-configs.a b", [{"devices": "all", "mig-enabled": False}]
    ),
    "mig-parted: no configs": put(MIG_PARTED, "mig-configs", {}),
    "mig-parted: a config without entries": put(MIG_PARTED, "mig-configs.split", []),
    "vgpu-device-manager: a type it does not name": put(
        VGPU_DEVICE_MANAGER, "vgpu-configs.A100-4C[0].vgpu-devices", {"A100-4X": 1}
    ),
    "vgpu-device-manager: 257 of a type": put(
        VGPU_DEVICE_MANAGER, "vgpu-configs.A100-4C[0].vgpu-devices", {"A100-4C": 257}
    ),
    "vgpu-device-manager: no vgpu-devices": put(VGPU_DEVICE_MANAGER, "vgpu-configs.A100-4C[0].vgpu-devices", DELETE),
}

CROSS_DOCS = {
    "a GPU name twice": put(base(), "gpuprov_host.gpus[1].name", "console"),
    "a layout not declared": put(base(), "gpuprov_host.layout", "nope"),
    "a disk without base or path": put(
        put(base(), "gpuprov_host.vm_defaults.disk", DELETE), f"{VM}.disk", {"size_gib": 1}
    ),
    "a boot without a kernel": put(base(), f"{VM}.boot", {"cmdline": "quiet"}),
    "a cpuset of 4 for 2 vCPUs": put(base(), f"{VM}.cpuset", "0-3"),
    "a cpulist high-low": put(base(), f"{VM}.cpuset", "3-2"),
    "a cpulist's CPU twice": put(base(), f"{VM}.cpuset", "2,2"),
    "a cpuset beyond the host's CPUs": put(base(), f"{VM}.cpuset", "40-41"),
    "reserved_cpus high-low": put(base(), "gpuprov_host.reserved_cpus", "1-0"),
    "nvlink_clique of one GPU": put(base(), f"{VM}.gpus", ["train[0]"]),
    "mig-parted: two entries for all": layouts(
        put(MIG_PARTED, "mig-configs.a100", [{"devices": "all", "mig-enabled": False}] * 2)
    ),
    "mig-parted: one profile twice": layouts(
        put(MIG_PARTED, "mig-configs.all-1g[0].mig-devices", {"2c.2g.20gb": 1, "2g.20gb": 1})
    ),
    "vgpu-device-manager: two kinds": layouts(
        put(VGPU_DEVICE_MANAGER, "vgpu-configs.A100-4C[0].vgpu-devices", {"A100-4C": 1, "A100-1-5C": 1})
    ),
    "vgpu-device-manager: 300 vGPUs": layouts(
        put(VGPU_DEVICE_MANAGER, "vgpu-configs.A100-4C[0].vgpu-devices", {"A100-4C": 200, "A100-8C": 100})
    ),
}


@functools.cache
def hostile() -> dict[str, Any]:
    docs = {
        name: put(base(), path, value) if isinstance(path, str) else base() | {path: value}
        for name, (path, value) in HOSTILE.items()
    }
    docs |= {name: layouts(value, {"version": 1}) for name, value in HOSTILE_LAYOUTS.items()}
    return docs


# ---------------------------------------------------------------- the same documents, three readers


@pytest.mark.parametrize("name", VALID)
def test_a_valid_document_passes_the_published_schema_the_validator_and_the_resolver(name, facts) -> None:
    doc = VALID[name]
    assert [e.message for e in THEIRS.iter_errors(doc)] == []
    assert check(doc, ROOT).items == []
    assert problems(doc, facts) == []


@pytest.mark.parametrize("name", list(hostile()))
def test_a_hostile_document_fails_the_published_schema_the_validator_and_the_resolver(name, facts) -> None:
    doc = hostile()[name]
    assert not theirs(doc), name
    assert not ours(doc), name
    found = problems(doc, facts)
    assert found, name  # `gpuprov plan` exits 2 on it
    assert not any("Traceback" in m for m in found)


@pytest.mark.parametrize("name", CROSS_DOCS)
def test_what_a_schema_cannot_say_the_resolver_refuses_alone(name, facts) -> None:
    doc = CROSS_DOCS[name]
    assert theirs(doc) and ours(doc), name
    found = problems(doc, facts)
    assert found and not beyond_the_schema(found), found


def test_a_whole_float_is_the_one_difference_from_json_numbers() -> None:
    for doc in (put(base(), f"{VM}.memory_mib", 4096.0), put(base(), "gpuprov_host.version", 1.0)):
        assert STOCK.is_valid(doc)  # JSON: 1.0 is the integer 1
        assert not theirs(doc) and not ours(doc)  # YAML: a float, refused ("write 4096")


def test_a_mapping_keyed_by_numbers_is_refused_by_both() -> None:
    doc = put(base(), f"{GPU}.instances", {474: 1})  # YAML's unquoted number as a key
    assert not theirs(doc) and not ours(doc)


# ---------------------------------------------------------------- the version


@pytest.mark.parametrize("version", [2, "1", 1.0, True, 0, None, [1]])
def test_an_unknown_version_is_the_one_problem_named_with_the_supported_ones(facts, version) -> None:
    doc = put(put(base(), "gpuprov_host.version", version), f"{VM}.memory_mib", "lots")
    model = resolve(doc, facts)
    assert len(model.problems) == 1 and model.problems[0].message.startswith("gpuprov_host.version")
    assert "1 (the versions this gpuprov reads)" in (model.problems[0].fix or "")
    assert (model.vm_list, model.layout, model.vfio_devices) == ([], {}, [])


def test_a_declaration_without_a_version_is_read_as_1_with_a_warning(facts) -> None:
    model = resolve(put(base(), "gpuprov_host.version", DELETE), facts)
    assert model.problems == [] and NO_VERSION in model.warnings
    assert NO_VERSION not in resolve(base(), facts).warnings


def test_init_and_convert_write_version_1(facts, capsys, tmp_path) -> None:
    assert main(["init", "--root", facts.root]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["gpuprov_host"]["version"] == 1
    old = tmp_path / "old.yml"
    old.write_text(yaml.safe_dump({"vfio_host_devices": [H100[0]], "gpu_vms_list": [{"name": "a", "gpus": [H100[0]]}]}))
    assert main(["convert", str(old), "--root", facts.root]) == 0
    new = yaml.safe_load(capsys.readouterr().out)
    assert new["gpuprov_host"]["version"] == 1 and ours(new) and theirs(new)


def test_convert_refuses_what_the_new_form_does_not_take(facts, capsys, tmp_path) -> None:
    old = tmp_path / "old.yml"
    old.write_text(yaml.safe_dump({"gpu_vms_list": [{"name": "a", "disk": {"base": "/images/caf\u00e9.qcow2"}}]}))
    assert main(["convert", str(old), "--root", facts.root]) == 2
    err = capsys.readouterr().err
    assert "gpuprov_host.vms[0].disk.base" in err and "nothing was converted" in err


# ---------------------------------------------------------------- every example


@functools.cache
def examples() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for page in [
        REPO / "README.md",
        REPO / "docs/reference/host-model.md",
        *sorted((REPO / "docs/guides").glob("*.md")),
    ]:
        blocks = re.findall(r"^```yaml\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)
        for i, block in enumerate(blocks):
            doc = yaml.safe_load(block)
            if isinstance(doc, dict) and ("gpuprov_host" in doc or "gpuprov_layouts" in doc):
                found[f"{page.relative_to(REPO).as_posix()}#{i}"] = doc
    for path in sorted((REPO / "inventories").rglob("*.yml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and ("gpuprov_host" in doc or "gpuprov_layouts" in doc):
            found[path.relative_to(REPO).as_posix()] = doc
    return found


def test_the_readme_and_the_inventories_have_declarations() -> None:
    assert any(n.startswith("README.md#") for n in examples()) and any(n.startswith("inventories/") for n in examples())


@pytest.mark.parametrize("name", list(examples()))
def test_every_example_passes_the_published_schema_and_the_validator_with_its_version(name) -> None:
    doc = examples()[name]
    assert [e.message for e in THEIRS.iter_errors(doc)] == [] and check(doc, ROOT).items == []
    if "gpuprov_host" in doc:
        assert doc["gpuprov_host"].get("version") == 1, f"{name}: declare version: 1"


# ---------------------------------------------------------------- the schema is what check evaluates


def nodes(node: Any, where: str = "#") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node (a mapping in a schema position), with where it is."""
    out = [(where, node)]
    for key in ("items", "additionalProperties", "propertyNames", "not", "if", "then", "else"):
        if isinstance(node.get(key), dict):
            out += nodes(node[key], f"{where}/{key}")
    for key in ("properties", "$defs"):
        for name, sub in (node.get(key) or {}).items():
            out += nodes(sub, f"{where}/{key}/{name}")
    for i, sub in enumerate(node.get("allOf") or []):
        out += nodes(sub, f"{where}/allOf/{i}")
    return out


ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description"}


def test_the_published_schema_is_the_package_s_and_a_valid_json_schema() -> None:
    assert PUBLISHED == json.loads(json.dumps(SCHEMA))
    jsonschema.Draft202012Validator.check_schema(PUBLISHED)


def test_the_schema_uses_only_keywords_the_validator_evaluates() -> None:
    for where, node in nodes(SCHEMA):
        assert set(node) <= KEYWORDS | ANNOTATIONS, (where, set(node) - KEYWORDS - ANNOTATIONS)
        assert "$ref" not in node or set(node) == {"$ref"}, where  # a reference stands alone


def test_every_list_and_mapping_the_validator_walks_is_bounded() -> None:
    checked = {"array": 0, "object": 0}
    for where, node in nodes(SCHEMA):
        types = node.get("type", [])
        types = [types] if isinstance(types, str) else types
        walks = {"items", "uniqueItems", "properties", "additionalProperties", "propertyNames", "required"} & set(node)
        if "array" in types and walks:
            checked["array"] += 1
            assert "maxItems" in node, where
        if "object" in types and walks and where != "#":  # the file's other variables are not walked
            checked["object"] += 1
            assert "maxProperties" in node or node.get("additionalProperties") is False, where
    assert checked["array"] >= 10 and checked["object"] >= 10, checked  # the walk reached the schema's nodes


def test_every_pattern_means_the_same_in_ecma_262_and_python() -> None:
    for where, node in nodes(SCHEMA):
        pattern = node.get("pattern")
        if pattern is None:
            continue
        assert pattern.startswith("^") and pattern.endswith("$(?!\\n)"), where
        assert not re.search(r"\\[dDwWsSbB]|\(\?P|\(\?<", pattern), where  # ASCII classes, no Python-only syntax


def test_the_number_patterns_take_exactly_their_ranges() -> None:
    cpu = re.compile(decl.whole(decl._CPU))
    type_id = re.compile(decl.whole(decl._TYPE_ID))
    for n in range(0, 70000):
        for text in (str(n), str(n).zfill(5)):
            if len(text) <= 5:
                assert bool(cpu.search(text)) == (n < 8192), text
        assert bool(type_id.search(str(n))) == (1 <= n <= 65535), n
    assert not cpu.search("000001") and not cpu.search("-1")


# ---------------------------------------------------------------- the patterns against validate's rules


@given(st.text(alphabet=st.sampled_from("/.a b{%-\t\n"), max_size=24))
def test_the_path_pattern_is_validate_s_path_rule_on_ascii(text) -> None:
    accepted = path_text(Problems(), "x", text) is not None
    assert bool(re.search(decl.whole(decl.PATH), text)) == accepted, text


@given(st.text(alphabet=st.sampled_from("0123456789-, "), max_size=16))
def test_the_cpulist_pattern_takes_every_cpulist_validate_takes(text) -> None:
    if cpu_list(Problems(), "x", text) is not None:
        assert re.search(decl.whole(decl.CPULIST), text), text
    elif re.search(decl.whole(decl.CPULIST), text):  # the grammar holds: only the ranges break it (CROSS)
        found = Problems()
        cpu_list(found, "x", text)
        assert any(f in found.items[0].message for f in CROSS), (text, found.items)


@given(
    st.sampled_from(SSH_KEY_TYPES), st.binary(max_size=40), st.sampled_from(["", " me@host", "  a b"]), st.booleans()
)
def test_the_ssh_key_pattern_is_validate_s_key_rule(key_type, data, comment, same) -> None:
    import base64

    name = (key_type if same else "ssh-ed25519" if key_type != "ssh-ed25519" else "ssh-rsa").encode()
    body = base64.b64encode(len(name).to_bytes(4, "big") + name + data).decode()
    text = f"{key_type} {body}{comment}"
    for line in (text, text.replace(body, body[:-1]), f" {text}\n", text + "\n" + text, text + " {{ x }}"):
        accepted = ssh_key(Problems(), "x", line) is not None
        assert bool(re.search(decl.whole(decl.SSH_KEY), line)) == accepted, line
    assert (ssh_key(Problems(), "x", text) is not None) == same


# ---------------------------------------------------------------- documents from the schema (hypothesis)


def from_schema(node: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values a schema node describes (every keyword of the VM keys and the host settings):
    its enum, one of its types, strings from its pattern, numbers at and inside its bounds."""
    if "$ref" in node:
        return from_schema(decl._EVALUATOR._resolve(node["$ref"]), depth)
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if "const" in node:
        return st.just(node["const"])
    types = node.get("type", ["null"])
    return st.one_of(*(_of_type(node, t, depth) for t in ([types] if isinstance(types, str) else types)))


def _of_type(node: dict[str, Any], kind: str, depth: int) -> st.SearchStrategy[Any]:
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        lo, hi = node.get("minimum", -(2**40)), node.get("maximum", 2**40)
        return st.one_of(st.sampled_from([lo, hi]), st.integers(lo, min(hi, lo + 64)), st.integers(lo, hi))
    if kind == "string":
        if "pattern" in node:
            limit = node.get("maxLength", 10**6)
            return st.from_regex(node["pattern"]).filter(lambda s: node.get("minLength", 0) <= len(s) <= limit)
        return st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=8)
    if kind == "array":
        items = from_schema(node.get("items", {}), depth + 1)
        unique = {"unique": True} if node.get("uniqueItems") else {}
        return st.lists(items, min_size=node.get("minItems", 0), max_size=min(3, node["maxItems"]), **unique)
    assert kind == "object" and depth < 6
    properties = node.get("properties", {})
    if not properties and isinstance(node.get("additionalProperties"), dict):  # counts: {type: n}
        keys = from_schema(node["propertyNames"], depth + 1)
        return st.dictionaries(keys, from_schema(node["additionalProperties"], depth + 1), max_size=3)
    required = set(node.get("required", ()))
    lo, hi = node.get("minProperties", 0), node.get("maxProperties", 10**6)
    return st.fixed_dictionaries(
        {k: from_schema(v, depth + 1) for k, v in properties.items() if k in required},
        optional={k: from_schema(v, depth + 1) for k, v in properties.items() if k not in required},
    ).filter(lambda d: lo <= len(d) <= hi)


def _gpu_entry(name: str) -> st.SearchStrategy[dict[str, Any]]:
    gpu = decl._EVALUATOR._resolve("#/$defs/gpu")["properties"]

    def entry(use: str, where: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "use": use, **where, **extra}

    where = st.one_of(
        st.builds(lambda a: {"address": a}, st.sampled_from([CONSOLE, *H100, VGPU, SRIOV, "0000:99:00.0"])),
        st.builds(lambda s: {"select": s}, from_schema(gpu["select"])),
    )
    return st.one_of(
        st.builds(entry, st.sampled_from(["host", "passthrough"]), where, st.just({})),
        st.builds(
            entry,
            st.sampled_from(["mdev", "sriov_vgpu"]),
            where,
            st.fixed_dictionaries({}, optional={"instances": from_schema(gpu["instances"])}),
        ),
        st.builds(entry, st.just("mig"), where, st.fixed_dictionaries({}, optional={"mig": from_schema(gpu["mig"])})),
    )


def declarations() -> st.SearchStrategy[dict[str, Any]]:
    host = decl._EVALUATOR._resolve("#/$defs/host")["properties"]
    vm = decl._EVALUATOR._resolve("#/$defs/vm")["properties"]
    vms = st.lists(
        st.fixed_dictionaries(
            {"name": from_schema(vm["name"])}, optional={k: from_schema(v) for k, v in vm.items() if k != "name"}
        ),
        max_size=2,
    )
    gpus = st.tuples(_gpu_entry("g0"), _gpu_entry("g1")).map(list)
    settings = {k: from_schema(host[k]) for k in ("reserved_memory_mib", "reserved_cpus", "mixed_vgpu_types")}
    return st.fixed_dictionaries(
        {"version": st.just(1), "gpus": gpus, "vms": vms},
        optional={"vm_defaults": from_schema(host["vm_defaults"]), **settings},
    ).map(lambda h: {"gpuprov_host": h})


JUNK = ["lots", -1, 10**30, 4096.5, 1.0, True, None, "", "x\n", "{{ x }}", "\x07", "\u00e9", [], {}, [1], {"k": 1}]


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """A generated declaration with one value, anywhere in it, replaced by junk (or a key added)."""
    doc = draw(declarations())
    paths: list[list[Any]] = []

    def walk(node: Any, path: list[Any]) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, [*path, k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, [*path, i])

    walk(doc["gpuprov_host"], ["gpuprov_host"])
    path = draw(st.sampled_from(paths))
    node = doc
    for part in path[:-1]:
        node = node[part]
    junk = draw(st.sampled_from(JUNK))
    if isinstance(node[path[-1]], dict) and draw(st.booleans()):
        node[path[-1]]["colour"] = junk
    else:
        node[path[-1]] = junk
    return doc


@given(declarations())
def test_a_document_generated_from_the_schema_is_one_the_resolver_takes(facts, doc) -> None:
    assert ours(doc) == theirs(doc), doc
    if ours(doc):  # what the schema takes, plan takes, but for what no schema can say
        assert beyond_the_schema(problems(doc, facts)) == [], doc


@given(mutated())
def test_a_mutated_document_gets_one_verdict_from_all_three(facts, doc) -> None:
    assert ours(doc) == theirs(doc), doc
    found = problems(doc, facts)
    if ours(doc):
        assert beyond_the_schema(found) == [], doc
    else:
        assert found, doc


def test_the_declarations_vm_fields_are_core_vm_specs_keys() -> None:
    """One list of a VM's keys (core/vm_spec): the declaration describes each, less the slices
    (mdevs, vfs) it places from gpus itself."""
    assert set(decl._VM_FIELDS) == set(decl.VM_KEYS) - {"mdevs", "vfs"}
