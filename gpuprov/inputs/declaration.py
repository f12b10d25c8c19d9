"""The host declaration's JSON Schema, and the one validator every reader runs it through.

One spec, written once: ``SCHEMA`` is plain data (JSON Schema, draft 2020-12) and :func:`check`
is a small evaluator of that same data, so there is no second, hand-written validator to drift
from it. The schema is published as docs/reference/gpuprov-host.schema.json by
dev/tools/gen_reference.py and printed by ``gpuprov schema``; tests/inputs/test_declaration_spec.py
feeds the same valid and hostile documents to it through the ``jsonschema`` package and to
:func:`check` and :func:`gpuprov.model.resolve.resolve`, and asserts that they agree.

What it describes: a host_vars (or group_vars) file. ``gpuprov_host`` (the host, with its
``version``) and ``gpuprov_layouts`` (named layouts, or a mig-parted / vgpu-device-manager file as
it is); other variables are the roles' and are left alone, except the old variables
(:data:`OLD_FORM`), which may not stand beside ``gpuprov_host``. Every rule that judges one value
is in the schema, the VM entries' too (the rules of :mod:`gpuprov.inputs.validate` that
:func:`gpuprov.inputs.vm_list.parse_vm` applies again when it builds each VM): types, ranges,
patterns, enums, required and unknown keys. What JSON Schema cannot say is checked when the
declaration is resolved (:func:`gpuprov.model.resolve.resolve`), listed in
docs/reference/host-model.md ("What the schema cannot say"): a name used twice, a layout or a
GPU named but not declared, a VM's values merged with ``vm_defaults`` (a disk needs a base or a
path, a boot a kernel, a cpuset one CPU per vCPU), a cpulist's ranges (low-high, each CPU once,
within the host), what names stand for on the host, and a layout file's entries taken together.

The schema is evaluated by :class:`gpuprov.inputs.schema_eval.Evaluator` (the keywords it knows,
how its patterns and whole numbers read); each problem names its path (``gpuprov_host.gpus[2].use``)
and, as its fix, the ``description`` of the rule it broke.

Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

import base64
import re
from typing import Any

from ..core.vm_spec import ACCELS, DRAINS, FIRMWARES, ROM_DIR, STATES, VM_KEYS
from ..facts.numa import MAX_CPUS
from .schema_eval import Evaluator
from .sharing_schema import GUEST_DEFS
from .validate import (
    HOSTNAME_RE,
    MACHINE_RE,
    MAX_CMDLINE,
    MAX_DEVICES,
    MAX_DISK_GIB,
    MAX_GPUS,
    MAX_INSTANCES,
    MAX_KEYS,
    MAX_MEMORY_MIB,
    MAX_MIG_INSTANCES,
    MAX_NUMA_NODE,
    MAX_PACKAGES,
    MAX_PATH,
    MAX_SSH_KEY,
    MAX_TEXT,
    MAX_VCPUS,
    MAX_VGPU_TYPE,
    MAX_VMS,
    NETWORK_RE,
    PACKAGE_RE,
    SSH_KEY_TYPES,
    USER_RE,
    VENDOR_ID_RE,
    VM_NAME_RE,
    Problems,
)

SCHEMA_ID = "https://gpuprov.dev/schemas/gpuprov-host.schema.json"
ROOT = "(the file)"  # how messages name the whole document

# The declaration's versions: what ``gpuprov_host.version`` may say. A declaration without one
# is read as VERSION, with a warning (docs/reference/host-model.md, "Version").
VERSIONS = (1,)
VERSION = VERSIONS[-1]
NO_VERSION = (
    f"gpuprov_host has no version: read as version {VERSION}; add `version: {VERSION}` to gpuprov_host "
    "(`gpuprov init` and `gpuprov convert` write it)"
)
# The old variables (and the gpu_vms settings gpuprov_host replaces): none may stand beside gpuprov_host.
OLD_FORM = (
    "gpuprov_gpus",
    "gpu_vms_list",
    "vfio_host_devices",
    "gpu_vms_defaults",
    "gpu_vms_reserved_memory_mib",
    "gpu_vms_reserved_cpus",
    "gpu_vms_mixed_vgpu_types",
)
# The variables a host_vars file may hold for gpuprov (a typo of one gets a "did you mean").
TOP_KEYS = ("gpuprov_host", "gpuprov_layouts", "gpuprov_guest", *OLD_FORM)
USES = ("host", "passthrough", "mdev", "sriov_vgpu", "mig")
VGPU_USES = ("mdev", "sriov_vgpu")
MAX_LAYOUTS = 1024  # named layouts, and a layout file's configs
MAX_KEYS_OF_ENTRY = 64  # a mapping with known keys: bounded before its unknown keys are named
MAX_PROFILES = 64  # vGPU types or MIG profiles counted for one GPU
FORMAT_VERSION = "v1"  # mig-parted's and vgpu-device-manager's one version


def whole(body: str) -> str:
    """A pattern that matches all of a text, the same in ECMA-262 and in Python's ``re``."""
    return "^" + (f"(?:{body})" if "|" in body else body) + "$(?!\\n)"


# ---------------------------------------------------------------- the patterns' parts

NAME = "[a-z][a-z0-9_-]{0,31}"  # a GPU entry's or an instance's name
# A reference from a VM: a GPU's name, one of its GPUs (name[j]), or an instance (name.i or its own name).
REF = NAME + r"(?:\[[0-9]{1,4}\]|\.[0-9]{1,4})?"
# A layout's name: mig-parted's and vgpu-device-manager's config names (all-1g.10gb) fit.
LAYOUT_NAME = "[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}"
PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[01][0-9a-fA-F]\.[0-7]"  # what facts.pci.normalize_address takes, in full
# use: mdev also takes a non-PCI parent by its sysfs name (the kernel's mtty sample).
PARENT_NAME = "[A-Za-z][A-Za-z0-9_.-]{0,63}"
EXPECT = "[0-9a-f]{4}:[0-9a-f]{4}(?::[0-9a-f]{4}:[0-9a-f]{4})?"
UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
PRINTABLE = "[ -~]"  # printable ASCII: what every free text of a declaration is written in
NO_TEMPLATE = r"(?![ -~]*\{[{%])"  # no Jinja: gpuprov reads files as written
# A vGPU type or MIG profile by name, or a numeric ID (digits alone are an ID: 1 to 65,535).
_TYPE_ID = r"0*(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
TYPE = rf"(?! *[0-9]+ *$)[ -.0-~]+| *{_TYPE_ID} *"
# A CPU number below facts.numa.MAX_CPUS (8,192), in at most five digits (validate.cpu_list's).
_CPU = "0?(?:[0-9]{1,3}|[0-7][0-9]{3}|80[0-9]{2}|81[0-8][0-9]|819[01])"
CPULIST = rf" *(?:{_CPU}(?:-{_CPU})?(?: *, *{_CPU}(?:-{_CPU})?)*)? *"
# An absolute, normalized path (validate.path_text): no '.' or '..' segment, no '//'.
_SEGMENT = r"(?!\.\.?(?:/|$))[ -.0-~]+"
PATH = rf"{NO_TEMPLATE}/(?:{_SEGMENT}(?:/{_SEGMENT})*/*)?"
ROM_PATH = rf"{NO_TEMPLATE}{ROM_DIR}/(?:{_SEGMENT}(?:/{_SEGMENT})*/*)?"
# A unicast MAC, not all zeros (validate.mac_address; any case).
MAC = "(?!00(?::00){5}$)[0-9a-fA-F][02468aceACE](?::[0-9a-fA-F]{2}){5}"
MACHINE = "(?=q35|pc-q35)" + MACHINE_RE.pattern  # GPUs need PCIe: a q35 machine type
# A MIG profile as nvidia-smi names GPU instance profiles (1g.10gb, 1g.10gb+me, 1g.24gb+me.all);
# mig-parted's Cc.Gg.Mgb only where C == G (a compute instance over all of its GPU instance).
MIG_PROFILE_ATTR = "[+-][a-z][a-z0-9]*(?:[.,][a-z][a-z0-9]*)*"
MIG_PROFILE = (
    "(?:" + "|".join(f"{n}c\\.{n}g" for n in range(1, 9)) + rf"|[1-8]g)\.[0-9]{{1,4}}gb(?:{MIG_PROFILE_ATTR})?"
)
# vgpu-device-manager's type names (pkg/types/vgpu_type.go): time-sliced "A100-4C", "A100D-80C",
# "M60-0Q"; MIG-backed "A100-1-5C", "A100-1-5CME".
VGPU_TIME_SLICED = "[A-Z0-9]+(?:-[a-zA-Z]+)*-(?:0|[1-9][0-9]{0,3})[ABCQ]"
VGPU_MIG_BACKED = "[A-Z0-9]+-[1-9]-(?:0|[1-9][0-9]{0,3})[ABCQ](?:ME|NOME|MEALL|GFX)?"
# A device-filter as the tools write it: "0x" + device + vendor, NVIDIA's ("0x20B010DE" is 10de:20b0).
DEVICE_FILTER = "0[xX][0-9A-Fa-f]{4}10[dD][eE]"

LAYOUT_PATTERN = whole(LAYOUT_NAME)


def _ssh_key_body(key_type: str) -> str:
    """The base64 of a key whose blob starts with its type (validate.ssh_key), canonically padded:
    the header's characters are fixed, and where it ends inside a group of three bytes the next
    character takes the header's last bits and any low bits."""
    b64 = "[A-Za-z0-9+/]"
    rest = f"(?:{b64}{{4}})*(?:{b64}{{2}}==|{b64}{{3}}=)?"
    name = key_type.encode()
    header = len(name).to_bytes(4, "big") + name
    cut = len(header) - len(header) % 3
    left = header[cut:]  # 0, 1 or 2 bytes of the header in its last group
    encoded = base64.b64encode(header[:cut] + left + b"\0" * (-len(left) % 3)).decode()
    fixed = encoded[: cut // 3 * 4 + len(left)]
    if not left:
        return _escaped(fixed) + rest
    low = 6 - 2 * len(left)  # the low bits of the next character are the key's
    first = _ALPHABET.index(encoded[len(fixed)]) >> low << low
    choice = "[" + _escaped(_ALPHABET[first : first + (1 << low)]) + "]"
    tail = f"(?:==|{b64}=|{b64}{{2}}{rest})" if len(left) == 1 else f"(?:=|{b64}{rest})"
    return _escaped(fixed) + choice + tail


_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _escaped(text: str) -> str:
    """Base64 text as a pattern: + and / escaped (valid in both dialects, in a class or out)."""
    return text.replace("+", "\\+").replace("/", "\\/")


# One public key on one line: TYPE BASE64 [comment]; spaces and line ends around it are trimmed.
SSH_KEY = (
    rf"[\t\n\r ]*{NO_TEMPLATE}(?:"
    + "|".join(t.replace(".", r"\.") + " +" + _ssh_key_body(t) for t in SSH_KEY_TYPES)
    + r")(?: +[ -~]*)?[\t\n\r ]*"
)


# ---------------------------------------------------------------- the schema

_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_INSTANCES, "description": "a count, 0 to 256"}
_MIG_COUNT = {
    "type": "integer",
    "minimum": 0,
    "maximum": MAX_MIG_INSTANCES,
    "description": "a MIG profile's count, 0 to 7",
}
_TYPE = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_TEXT,
    "pattern": whole(TYPE),
    "description": "a name in printable ASCII without / (A100-4C, nvidia-474, 1g.10gb), or a numeric ID, 1 to 65,535",
}


def _cpus(description: str) -> dict[str, Any]:
    return {
        "type": ["string", "integer", "array", "null"],
        "maxLength": MAX_TEXT * 16,
        "pattern": whole(CPULIST),
        "minimum": 0,
        "maximum": MAX_CPUS - 1,
        "maxItems": MAX_CPUS,
        "uniqueItems": True,
        "items": {"type": "integer", "minimum": 0, "maximum": MAX_CPUS - 1, "description": "a CPU number"},
        "description": description,
    }


def _path(description: str) -> dict[str, Any]:
    return {"type": ["string", "null"], "maxLength": MAX_PATH, "pattern": whole(PATH), "description": description}


def _closed(properties: dict[str, Any], description: str, **more: Any) -> dict[str, Any]:
    """A mapping of known keys only."""
    return {
        "type": "object",
        "maxProperties": MAX_KEYS_OF_ENTRY,
        "additionalProperties": False,
        "properties": properties,
        "description": description,
        **more,
    }


def _text(regex: re.Pattern[str], description: str, *nullable: str) -> dict[str, Any]:
    return {"type": ["string", *nullable], "pattern": whole(regex.pattern), "description": description}


_BOOL = {"type": ["boolean", "null"], "description": "true or false"}

# A VM's keys (docs/reference/inputs.md, "VM entry"), each as validate's rules take it: null is
# "not given" (a VM's null overrides vm_defaults' value). mdevs and vfs are gone: vGPU instances
# are declared under their GPU and named in gpus.
_VM_FIELDS: dict[str, Any] = {
    "name": _text(
        VM_NAME_RE,
        "1 to 63 of A-Za-z0-9_.+-, starting with a letter or digit (the libvirt domain, its files, its host name)",
    ),
    "state": {"enum": [*STATES, None], "description": "one of " + ", ".join(STATES)},
    "memory_mib": {
        "type": ["integer", "null"],
        "minimum": 64,
        "maximum": MAX_MEMORY_MIB,
        "description": f"the VM's memory, a whole number of MiB from 64 to {MAX_MEMORY_MIB:,}",
    },
    "vcpus": {
        "type": ["integer", "null"],
        "minimum": 1,
        "maximum": MAX_VCPUS,
        "description": f"a whole number from 1 to {MAX_VCPUS:,}",
    },
    "firmware": {"enum": [*FIRMWARES, None], "description": "one of " + ", ".join(FIRMWARES)},
    "accel": {"enum": [*ACCELS, None], "description": "one of " + ", ".join(ACCELS)},
    "machine": {
        "type": ["string", "null"],
        "pattern": whole(MACHINE),
        "description": "a q35 QEMU machine type (q35, pc-q35-*): lower-case letters, digits and ._-, at most 64",
    },
    "gpus": {
        "type": ["array", "null"],
        "maxItems": MAX_DEVICES,
        "items": {
            "type": ["string", "object"],
            "pattern": whole(REF),
            "maxProperties": MAX_KEYS_OF_ENTRY,
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": whole(REF), "description": "a GPU's name"},
                "rom": {
                    "type": ["string", "boolean", "null"],
                    "maxLength": MAX_PATH,
                    "pattern": whole(f"on|off|{ROM_PATH}"),
                    "description": f"on, off, a boolean, or a ROM file in {ROM_DIR}",
                },
            },
            "description": "a GPU's name (every GPU it selects), name[j] (its j-th GPU), an "
            "instance's name or name.i (its i-th instance), or {name, rom}",
        },
        "description": "what the VM gets, by name: at most 64",
    },
    "numa_node": {
        "type": ["integer", "null"],
        "minimum": 0,
        "maximum": MAX_NUMA_NODE,
        "description": f"a NUMA node, 0 to {MAX_NUMA_NODE:,}",
    },
    "cpuset": _cpus(
        "the host CPUs the vCPUs are pinned to, one per vCPU: a cpulist such as '0-3,8', one CPU number, "
        "or a list of them; below 8,192"
    ),
    "pin": _BOOL,
    "hugepages": {"enum": ["auto", "yes", "no", True, False, None], "description": "auto, yes, no, or a boolean"},
    "hide_kvm": _BOOL,
    "vendor_id": _text(VENDOR_ID_RE, "1 to 12 letters or digits", "null"),
    "network": {
        "type": ["string", "null"],
        "pattern": whole("|" + NETWORK_RE.pattern),
        "description": 'a libvirt network: 1 to 63 of A-Za-z0-9_.+-; null or "" for none',
    },
    "mac": {
        "type": ["string", "null"],
        "pattern": whole(MAC),
        "description": "a unicast MAC, six hex pairs, e.g. 52:54:00:12:34:56 (quoted: YAML reads it as a number)",
    },
    "disk": _closed(
        {
            "base": _path("the base image: an absolute, normalized path"),
            "size_gib": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": MAX_DISK_GIB,
                "description": f"the overlay's size, 1 to {MAX_DISK_GIB:,} GiB",
            },
            "path": _path("an existing disk: an absolute, normalized path"),
        },
        "{base, size_gib, path}: a base image (or an existing disk), its size",
        type=["object", "null"],
    ),
    "cloud_init": _closed(
        {
            "user": _text(USER_RE, "a Linux user name: lower-case letters, digits, _ and -, at most 32", "null"),
            "ssh_authorized_keys": {
                "type": ["array", "null"],
                "maxItems": MAX_KEYS,
                "items": {
                    "type": "string",
                    "maxLength": MAX_SSH_KEY,
                    "pattern": whole(SSH_KEY),
                    "description": "one public key per entry, one line of printable ASCII: TYPE BASE64 [comment] "
                    "(the line of a .pub file), its base64 naming the same type",
                },
                "description": f"public keys, at most {MAX_KEYS}",
            },
            "hostname": _text(HOSTNAME_RE, "a host name: letters, digits and -, at most 63", "null"),
            "packages": {
                "type": ["array", "null"],
                "maxItems": MAX_PACKAGES,
                "items": _text(PACKAGE_RE, "a package name (optionally =version)"),
                "description": f"packages to install, at most {MAX_PACKAGES:,}",
            },
        },
        "{user, ssh_authorized_keys, hostname, packages}",
        type=["object", "null"],
    ),
    "boot": _closed(
        {
            "kernel": _path("the kernel: an absolute, normalized path"),
            "initrd": _path("the initrd: an absolute, normalized path"),
            "cmdline": {
                "type": ["string", "null"],
                "maxLength": MAX_CMDLINE,
                "pattern": whole(NO_TEMPLATE + PRINTABLE + "*"),
                "description": f"one line of printable ASCII, at most {MAX_CMDLINE:,} characters",
            },
        },
        "{kernel, initrd, cmdline}: a direct kernel boot",
        type=["object", "null"],
    ),
    "autostart": _BOOL,
    "drain": {
        "enum": [*DRAINS, None],
        "description": "what a drain before a reboot or a rebind does to the running VM: shutdown (ACPI, "
        "wait, fail if it does not stop), force (then power it off), keep (leave it alone: the host is "
        "skipped with a reason)",
    },
    "nvlink_clique": {
        "type": ["boolean", "null"],
        "description": "true: all the VM's GPUs are one NVLink clique (lists of addresses: gpu_vm's vm only)",
    },
}
_DEFAULTS_KEYS = [k for k in VM_KEYS if k in _VM_FIELDS and k not in ("name", "gpus")]


def _format_entry(
    known: dict[str, Any], required: list[str], description: str, *rules: dict[str, Any]
) -> dict[str, Any]:
    """One entry of a mig-parted or vgpu-device-manager config (gpuprov.model.formats)."""
    filter_rule = "a PCI id as the tools write it, quoted, 0x + device + vendor (NVIDIA's): 0x20B010DE is 10de:20b0"
    return _closed(
        {
            "devices": {
                "type": ["string", "array"],
                "pattern": whole("all"),
                "minItems": 1,
                "maxItems": MAX_GPUS,
                "items": {"type": "integer", "minimum": 0, "maximum": MAX_GPUS - 1, "description": "a GPU index"},
                "description": "all, or a list of GPU indices ([0, 1]: nvidia-smi's numbering)",
            },
            "device-filter": {
                "type": ["string", "array", "null"],
                "pattern": whole("|" + DEVICE_FILTER),
                "maxItems": MAX_GPUS,
                "items": {"type": "string", "pattern": whole(DEVICE_FILTER), "description": filter_rule},
                "description": filter_rule,
            },
            **known,
        },
        description,
        required=required,
        allOf=[
            {
                # mig-parted skips a listed GPU the filter does not name, which no gpuprov entry expresses.
                "if": {
                    "required": ["device-filter"],
                    "properties": {"device-filter": {"type": ["string", "array"], "minLength": 1, "minItems": 1}},
                },
                "then": {
                    "properties": {
                        "devices": {
                            "const": "all",
                            "description": "with a device-filter, devices: all (or drop the filter and add an "
                            "expect guard to the converted entries)",
                        }
                    }
                },
            },
            *rules,
        ],
    )


def _format_file(key: str, entry: dict[str, Any], tool: str) -> dict[str, Any]:
    return _closed(
        {
            "version": {"const": FORMAT_VERSION, "description": f"{tool} files say version: v1"},
            key: {
                "type": "object",
                "minProperties": 1,
                "maxProperties": MAX_LAYOUTS,
                "propertyNames": {
                    "type": "string",
                    "pattern": LAYOUT_PATTERN,
                    "description": "a config (layout) name: 1 to 63 of A-Za-z0-9_.+-, starting with a letter or digit",
                },
                "additionalProperties": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_GPUS,
                    "items": entry,
                    "description": "the config's entries (- devices: all ...)",
                },
                "description": "each config's name and its list of entries",
            },
        },
        f"a {tool} file (docs/reference/formats.md)",
        required=["version", key],
    )


_MIG_PARTED = _format_file(
    "mig-configs",
    _format_entry(
        {
            "mig-enabled": {"type": "boolean", "description": "true or false"},
            "mig-devices": {
                "type": ["object", "null"],
                "maxProperties": MAX_PROFILES,
                "propertyNames": {
                    "type": "string",
                    "maxLength": 64,
                    "pattern": whole(MIG_PROFILE),
                    "description": 'a GPU instance profile as nvidia-smi mig -lgip names it: "1g.10gb", "3g.40gb", '
                    '"1g.10gb+me" (C.Gg only where C is G)',
                },
                "additionalProperties": _MIG_COUNT,
                "description": 'the profiles and their counts, e.g. {"1g.10gb": 7}; {} for none',
            },
        },
        ["devices", "mig-enabled"],
        "a mig-parted entry: devices, device-filter, mig-enabled, mig-devices",
        {
            "if": {"required": ["mig-enabled"], "properties": {"mig-enabled": {"const": True}}},
            "then": {
                "required": ["mig-devices"],
                "properties": {"mig-devices": {"type": "object"}},
                "description": 'mig-enabled is true: give the profiles, e.g. {"1g.10gb": 7}, or {} for none',
            },
            "else": {
                "properties": {
                    "mig-devices": {
                        "type": ["object", "null"],
                        "maxProperties": 0,
                        "description": "mig-enabled is false: drop mig-devices, or set mig-enabled: true",
                    }
                }
            },
        },
    ),
    "mig-parted",
)

_VGPU_DEVICE_MANAGER = _format_file(
    "vgpu-configs",
    _format_entry(
        {
            "vgpu-devices": {
                "type": "object",
                "maxProperties": MAX_PROFILES,
                "propertyNames": {
                    "type": "string",
                    "maxLength": 64,
                    "pattern": whole(f"{VGPU_TIME_SLICED}|{VGPU_MIG_BACKED}"),
                    "description": 'a vGPU type as vgpu-device-manager names it: "A100-4C", "A10-24Q", MIG-backed '
                    '"A100-1-5C"',
                },
                "additionalProperties": _COUNT,
                "description": 'the vGPU types and their counts on each GPU, e.g. {"A100-4C": 10}',
            },
        },
        ["devices", "vgpu-devices"],
        "a vgpu-device-manager entry: devices, device-filter, vgpu-devices",
    ),
    "vgpu-device-manager",
)


_ONE_OF_ADDRESS_SELECT = 'give exactly one of address and select: address: "0000:41:00.0", or select: all'


def _is_format(key: str) -> dict[str, Any]:
    """gpuprov.model.formats' recognition of a file: version v1 and its configs' key."""
    return {"required": ["version", key], "properties": {"version": {"const": FORMAT_VERSION}}}


SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "gpuprov host declaration",
    "description": "a host_vars (or group_vars) file: gpuprov_host (one per host), gpuprov_layouts (named GPU "
    "layouts hosts pick by name) and gpuprov_guest (a GPU guest: how its GPUs are shared); other variables are "
    "the roles', but the old ones never beside gpuprov_host",
    "type": "object",
    "properties": {
        "gpuprov_host": {"$ref": "#/$defs/host"},
        "gpuprov_layouts": {"$ref": "#/$defs/layouts"},
        "gpuprov_guest": {"$ref": "#/$defs/guest"},
    },
    "if": {"required": ["gpuprov_host"]},
    "then": {
        "properties": {
            key: {
                "not": {},
                "description": "declare the host once: `gpuprov convert FILE` writes the old variables in the new "
                f"form; merge that into gpuprov_host and remove {key}",
            }
            for key in OLD_FORM
        }
    },
    "$defs": {
        **GUEST_DEFS,
        "version": {
            "type": "integer",
            "enum": list(VERSIONS),
            "description": "the declaration's version: "
            + ", ".join(map(str, VERSIONS))
            + f" (the versions this gpuprov reads); without it, {VERSION}",
        },
        "host": _closed(
            {
                "version": {"$ref": "#/$defs/version"},
                "layout": {
                    "type": "string",
                    "pattern": LAYOUT_PATTERN,
                    "description": "the name of a layout in gpuprov_layouts; the host's own gpus add to it "
                    "(an entry of the same name replaces the layout's)",
                },
                "gpus": {"$ref": "#/$defs/gpus"},
                "vms": {
                    "type": "array",
                    "maxItems": MAX_VMS,
                    "items": {"$ref": "#/$defs/vm"},
                    "description": "the VMs of this host, at most 4,096",
                },
                "vm_defaults": {
                    "type": "object",
                    "maxProperties": len(_DEFAULTS_KEYS),
                    "propertyNames": {
                        "enum": _DEFAULTS_KEYS,
                        "description": "a VM key but name and gpus (docs/reference/inputs.md)",
                    },
                    "properties": {k: _VM_FIELDS[k] for k in _DEFAULTS_KEYS},
                    "description": "keys every VM takes unless it sets them (not name or gpus)",
                },
                "reserved_memory_mib": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "maximum": MAX_MEMORY_MIB,
                    "description": "host memory kept for the host, MiB, 0 to 16,777,216 (default 10% of RAM, at most "
                    "4 GiB)",
                },
                "reserved_cpus": {
                    **_cpus(
                        "host CPUs kept for the host: a cpulist such as '0-1', or one CPU number; '' or null: none"
                    ),
                    "type": ["string", "integer", "null"],
                },
                "mixed_vgpu_types": {
                    "type": "boolean",
                    "description": "the GPUs run NVIDIA's mixed-size vGPU mode: true or false",
                },
            },
            "the host: version, layout, gpus, vms, vm_defaults and the host settings",
        ),
        "layouts": {
            "type": "object",
            "maxProperties": MAX_LAYOUTS,
            "propertyNames": {
                "type": "string",
                "pattern": LAYOUT_PATTERN,
                "description": "a layout's name: 1 to 63 of A-Za-z0-9_.+-, starting with a letter or digit",
            },
            # A layout file's own keys: what they are depends on the file (below).
            "properties": {
                "version": {"description": "v1, in a mig-parted or vgpu-device-manager file; else a layout's name"},
                "mig-configs": {
                    "description": "a mig-parted file's configs (docs/reference/formats.md); else a layout's name"
                },
                "vgpu-configs": {
                    "description": "a vgpu-device-manager file's configs (docs/reference/formats.md); else a layout's "
                    "name"
                },
            },
            "additionalProperties": {"$ref": "#/$defs/layout"},
            "description": "named layouts (name -> {gpus: [...]}), or a mig-parted or vgpu-device-manager file as "
            "it is (version: v1 and mig-configs or vgpu-configs)",
            "if": _is_format("mig-configs"),
            "then": {"$ref": "#/$defs/mig_parted"},
            "else": {
                "if": _is_format("vgpu-configs"),
                "then": {"$ref": "#/$defs/vgpu_device_manager"},
                "else": {
                    "properties": {k: {"$ref": "#/$defs/layout"} for k in ("version", "mig-configs", "vgpu-configs")}
                },
            },
        },
        "mig_parted": _MIG_PARTED,
        "vgpu_device_manager": _VGPU_DEVICE_MANAGER,
        "layout": _closed({"gpus": {"$ref": "#/$defs/gpus"}}, "a named layout: {gpus: [...]}", required=["gpus"]),
        "gpus": {
            "type": "array",
            "maxItems": MAX_GPUS,
            "items": {"$ref": "#/$defs/gpu"},
            "description": "the host's GPUs, at most 1,024 entries",
        },
        "gpu": _closed(
            {
                "name": {
                    "type": "string",
                    "pattern": whole(NAME),
                    "description": "the name VMs use for it: a lower-case letter, then up to 31 of a-z 0-9 _ -",
                },
                "address": {
                    "type": "string",
                    "pattern": whole(f"{PCI}|{PARENT_NAME}"),
                    "description": 'its full PCI address, quoted ("0000:41:00.0", see `lspci -D`); '
                    "for use: mdev also a non-PCI parent's name",
                },
                "select": {
                    "type": ["string", "object"],
                    "pattern": whole("all|[0-9a-f]{4}:[0-9a-f]{4}"),
                    "maxProperties": 1,
                    "minProperties": 1,
                    "additionalProperties": False,
                    "properties": {
                        "model": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 128,
                            "pattern": whole("[^\\x00-\\x1f\\x7f]*"),
                            "description": "a text the GPU's name contains (case-insensitive)",
                        },
                        "index": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": MAX_GPUS - 1,
                            "description": "the N-th NVIDIA GPU by PCI address, from 0 (nvidia-smi's index)",
                        },
                    },
                    "description": "GPUs chosen from the host's facts: all (every NVIDIA GPU no other entry "
                    "names), a vendor:device such as 10de:2330, {model: TEXT} or {index: N}",
                },
                "expect": {
                    "type": "string",
                    "pattern": whole(EXPECT),
                    "description": "the id guard: vendor:device[:subsystem_vendor:subsystem_device] in "
                    "lower-case hex, e.g. 10de:2330 or 10de:2330:10de:16c1",
                },
                "use": {"enum": list(USES), "description": "one of " + ", ".join(USES)},
                "instances": {
                    "type": ["object", "array"],
                    "maxProperties": MAX_PROFILES,
                    "propertyNames": _TYPE,
                    "additionalProperties": _COUNT,
                    "maxItems": MAX_INSTANCES,
                    "items": {"$ref": "#/$defs/instance"},
                    "description": 'vGPU instances (use: mdev or sriov_vgpu): counts {"A100-4C": 10} or '
                    "a list of {type, name, uuid, vf}",
                },
                "mig": {
                    "type": ["object", "array"],
                    "maxProperties": MAX_PROFILES,
                    "propertyNames": _TYPE,
                    "additionalProperties": _MIG_COUNT,
                    "maxItems": MAX_INSTANCES,
                    "items": {
                        **_TYPE,
                        "type": ["string", "integer"],
                        "minimum": 0,
                        "maximum": MAX_VGPU_TYPE,
                        "description": "a MIG profile (1g.10gb) or its ID",
                    },
                    "description": 'MIG instances (use: mig): counts {"1g.10gb": 7} or a list of profiles',
                },
            },
            "a GPU entry: name, address or select, use, and its instances",
            required=["name", "use"],
            allOf=[
                {
                    "if": {"required": ["address"]},
                    "then": {
                        "properties": {
                            "select": {
                                "not": {},
                                "description": _ONE_OF_ADDRESS_SELECT,
                            }
                        }
                    },
                    "else": {
                        "required": ["select"],
                        "description": _ONE_OF_ADDRESS_SELECT,
                    },
                },
                {
                    "if": {"required": ["use"], "properties": {"use": {"const": "mdev"}}},
                    "else": {
                        "properties": {
                            "address": {
                                "pattern": whole(PCI),
                                "description": 'a full PCI address, quoted ("0000:41:00.0"): only use: mdev takes a '
                                "parent's name",
                            }
                        }
                    },
                },
                {
                    "if": {"required": ["use"], "properties": {"use": {"enum": list(VGPU_USES)}}},
                    "else": {
                        "properties": {
                            "instances": {"not": {}, "description": "instances is for use: mdev or sriov_vgpu"}
                        }
                    },
                },
                {
                    "if": {"required": ["use"], "properties": {"use": {"const": "mig"}}},
                    "else": {"properties": {"mig": {"not": {}, "description": "mig is for use: mig"}}},
                },
            ],
        ),
        "instance": _closed(
            {
                "type": {
                    **_TYPE,
                    "type": ["string", "integer"],
                    "minimum": 1,
                    "maximum": MAX_VGPU_TYPE,
                    "description": "the vGPU type's name (A100-4C, nvidia-474) or numeric ID, 1 to 65,535",
                },
                "name": {"type": "string", "pattern": whole(NAME), "description": "its name, for VMs"},
                "uuid": {"type": "string", "pattern": whole(UUID), "description": "a canonical lower-case UUID"},
                "vf": {"type": "string", "pattern": whole(PCI), "description": "the VF's full PCI address"},
            },
            "a vGPU instance: {type, name, uuid (mdev), vf (sriov_vgpu)}",
            required=["type"],
        ),
        "vm": {
            "type": "object",
            "required": ["name"],
            "maxProperties": len(_VM_FIELDS),
            "propertyNames": {
                "enum": [k for k in VM_KEYS if k in _VM_FIELDS],
                "description": "a VM key (docs/reference/inputs.md); vGPU instances are named in gpus",
            },
            "properties": _VM_FIELDS,
            "description": "a VM: its keys as in docs/reference/inputs.md; gpus names GPUs and instances",
        },
    },
}


# ---------------------------------------------------------------- the evaluator

_EVALUATOR = Evaluator(SCHEMA, ROOT)


def check(value: Any, path: str, definition: str | None = None) -> Problems:
    """Every problem of ``value`` against the schema (or its ``$defs`` entry ``definition``)."""
    return _EVALUATOR.check(value, path, definition)


def check_version(doc: Any) -> Problems:
    """The declaration's version alone: a version this gpuprov does not read is the one problem
    told (the rest is not checked against a form it may not be written in)."""
    host = doc.get("gpuprov_host") if isinstance(doc, dict) else None
    if isinstance(host, dict) and "version" in host:
        return check(host["version"], "gpuprov_host.version", "version")
    return Problems()


def has_version(doc: Any) -> bool:
    host = doc.get("gpuprov_host") if isinstance(doc, dict) else None
    return isinstance(host, dict) and "version" in host
