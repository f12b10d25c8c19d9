"""The host declaration's JSON Schema, and the one validator every reader runs it through.

``SCHEMA`` is the schema of ``gpuprov_host`` and ``gpuprov_layouts`` (docs/reference/host-model.md;
published as docs/reference/gpuprov-host.schema.json by dev/tools/gen_reference.py, and printed by
``gpuprov schema``). :func:`check` validates a value against it with the small subset of JSON
Schema (draft 2020-12) the schema uses: ``type``, ``properties``, ``additionalProperties``,
``required``, ``enum``, ``pattern``, ``minLength``/``maxLength``, ``minimum``/``maximum``,
``items``, ``minItems``/``maxItems``, ``maxProperties``, ``propertyNames`` and local ``$ref``.
A JSON Schema validator (the ``jsonschema`` package, in the tests) gives the same verdicts.

Each problem names its path (``gpuprov_host.gpus[2].use``) and, as its fix, the
``description`` of the rule it broke. Sizes are checked before contents, so a huge list is
refused without being walked. A VM entry's own keys (memory, CPUs, disks...) are checked again by
:func:`gpuprov.inputs.vm_list.parse_vm`, which knows the host's limits.

Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from ..core.vm_spec import VM_KEYS
from .validate import MAX_DEVICES, MAX_GPUS, MAX_INSTANCES, MAX_MIG_INSTANCES, MAX_VMS, Problems, kind, shown

SCHEMA_ID = "https://gpuprov.dev/schemas/gpuprov-host.schema.json"
NAME_PATTERN = "^[a-z][a-z0-9_-]{0,31}$"
# A reference from a VM: a GPU's name, one of its GPUs (name[j]), or an instance (name.i or its own name).
# A layout's name: mig-parted's and vgpu-device-manager's config names (all-1g.10gb) fit.
LAYOUT_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}$"
REF_PATTERN = r"^[a-z][a-z0-9_-]{0,31}(\[[0-9]{1,4}\]|\.[0-9]{1,4})?$"
ADDRESS_PATTERN = "^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]$"
# use: mdev also takes a non-PCI parent by its sysfs name (the kernel's mtty sample).
PARENT_PATTERN = "^([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]|[A-Za-z][A-Za-z0-9_.-]{0,63})$"
ID_PAIR_PATTERN = "^[0-9a-f]{4}:[0-9a-f]{4}$"
EXPECT_PATTERN = "^[0-9a-f]{4}:[0-9a-f]{4}(:[0-9a-f]{4}:[0-9a-f]{4})?$"
UUID_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
TYPE_PATTERN = "^[^/\\x00-\\x1f]{1,255}$"
USES = ("host", "passthrough", "mdev", "sriov_vgpu", "mig")
MAX_LAYOUTS = 1024
ROOT = "(the file)"  # how messages name the whole document

_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_INSTANCES, "description": "a count, 0 to 256"}
_MIG_COUNT = {
    "type": "integer",
    "minimum": 0,
    "maximum": MAX_MIG_INSTANCES,
    "description": "a MIG profile's count, 0 to 7",
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "gpuprov host declaration",
    "description": "gpuprov_host (one per host) and gpuprov_layouts (named GPU layouts hosts pick by name)",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "gpuprov_host": {"$ref": "#/$defs/host"},
        "gpuprov_layouts": {
            "type": "object",
            "maxProperties": MAX_LAYOUTS,
            "propertyNames": {"pattern": LAYOUT_PATTERN, "description": "a layout's name: " + LAYOUT_PATTERN},
            "additionalProperties": {"$ref": "#/$defs/layout"},
            "description": "named layouts: a mapping name -> {gpus: [...]}",
        },
    },
    "$defs": {
        "host": {
            "type": "object",
            "additionalProperties": False,
            "description": "the host: layout, gpus, vms, vm_defaults and the host settings",
            "properties": {
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
                    "propertyNames": {"enum": [k for k in VM_KEYS if k not in ("name", "gpus", "mdevs", "vfs")]},
                    "description": "keys every VM takes unless it sets them (not name or gpus)",
                },
                "reserved_memory_mib": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "description": "host memory kept for the host, MiB (default 10% of RAM, at most 4 GiB)",
                },
                "reserved_cpus": {
                    "type": ["string", "integer", "null"],
                    "description": "host CPUs kept for the host: a cpulist such as 0-1",
                },
                "mixed_vgpu_types": {
                    "type": "boolean",
                    "description": "the GPUs run NVIDIA's mixed-size vGPU mode: true or false",
                },
            },
        },
        "layout": {
            "type": "object",
            "additionalProperties": False,
            "required": ["gpus"],
            "properties": {"gpus": {"$ref": "#/$defs/gpus"}},
            "description": "a named layout: {gpus: [...]}",
        },
        "gpus": {
            "type": "array",
            "maxItems": MAX_GPUS,
            "items": {"$ref": "#/$defs/gpu"},
            "description": "the host's GPUs, at most 1,024 entries",
        },
        "gpu": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "use"],
            "description": "a GPU entry: name, address or select, use, and its instances",
            "properties": {
                "name": {
                    "type": "string",
                    "pattern": NAME_PATTERN,
                    "description": "the name VMs use for it: a lower-case letter, then up to 31 of a-z 0-9 _ -",
                },
                "address": {
                    "type": "string",
                    "pattern": PARENT_PATTERN,
                    "description": 'its full PCI address, quoted ("0000:41:00.0", see `lspci -D`); '
                    "for use: mdev also a non-PCI parent's name",
                },
                "select": {
                    "type": ["string", "object"],
                    "pattern": "^(all|[0-9a-f]{4}:[0-9a-f]{4})$",
                    "maxProperties": 1,
                    "minProperties": 1,
                    "additionalProperties": False,
                    "properties": {
                        "model": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 128,
                            "pattern": "^[^\\x00-\\x1f]*$",
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
                    "pattern": EXPECT_PATTERN,
                    "description": "the id guard: vendor:device[:subsystem_vendor:subsystem_device] in "
                    "lower-case hex, e.g. 10de:2330 or 10de:2330:10de:16c1",
                },
                "use": {"enum": list(USES), "description": "one of " + ", ".join(USES)},
                "instances": {
                    "type": ["object", "array"],
                    "maxProperties": 64,
                    "propertyNames": {"pattern": TYPE_PATTERN, "description": "a vGPU type's name or ID"},
                    "additionalProperties": _COUNT,
                    "maxItems": MAX_INSTANCES,
                    "items": {"$ref": "#/$defs/instance"},
                    "description": 'vGPU instances (use: mdev or sriov_vgpu): counts {"A100-4C": 10} or '
                    "a list of {type, name, uuid, vf}",
                },
                "mig": {
                    "type": ["object", "array"],
                    "maxProperties": 64,
                    "propertyNames": {"pattern": TYPE_PATTERN, "description": "a MIG profile such as 1g.10gb"},
                    "additionalProperties": _MIG_COUNT,
                    "maxItems": MAX_INSTANCES,
                    "items": {
                        "type": ["string", "integer"],
                        "pattern": TYPE_PATTERN,
                        "minimum": 0,
                        "description": "a MIG profile (1g.10gb) or its ID",
                    },
                    "description": 'MIG instances (use: mig): counts {"1g.10gb": 7} or a list of profiles',
                },
            },
        },
        "instance": {
            "type": "object",
            "additionalProperties": False,
            "required": ["type"],
            "description": "a vGPU instance: {type, name, uuid (mdev), vf (sriov_vgpu)}",
            "properties": {
                "type": {
                    "type": ["string", "integer"],
                    "pattern": TYPE_PATTERN,
                    "minimum": 1,
                    "maximum": 65535,
                    "description": "the vGPU type's name (A100-4C, nvidia-474) or numeric ID",
                },
                "name": {"type": "string", "pattern": NAME_PATTERN, "description": "its name, for VMs"},
                "uuid": {"type": "string", "pattern": UUID_PATTERN, "description": "a canonical lower-case UUID"},
                "vf": {"type": "string", "pattern": ADDRESS_PATTERN, "description": "the VF's full PCI address"},
            },
        },
        "vm": {
            "type": "object",
            "required": ["name"],
            "propertyNames": {
                "enum": [k for k in VM_KEYS if k not in ("mdevs", "vfs")],
                "description": "a VM key (docs/reference/inputs.md); vGPU instances are named in gpus",
            },
            "description": "a VM: its keys as in docs/reference/inputs.md; gpus names GPUs and instances",
            "properties": {
                "gpus": {
                    "type": "array",
                    "maxItems": MAX_DEVICES,
                    "items": {
                        "type": ["string", "object"],
                        "pattern": REF_PATTERN,
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "pattern": REF_PATTERN, "description": "a GPU's name"},
                            "rom": {
                                "type": ["string", "boolean"],
                                "description": "on, off, a boolean, or a ROM file in /var/lib/libvirt/roms",
                            },
                        },
                        "description": "a GPU's name (every GPU it selects), name[j] (its j-th GPU), an "
                        "instance's name or name.i (its i-th instance), or {name, rom}",
                    },
                    "description": "what the VM gets, by name: at most 64",
                },
            },
        },
    },
}

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_MAX_DEPTH = 32


def _resolve(ref: str) -> dict[str, Any]:
    node: Any = SCHEMA
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _fix(schema: dict[str, Any]) -> str | None:
    return schema.get("description")


def _walk(p: Problems, schema: dict[str, Any], value: Any, path: str, depth: int) -> None:
    if "$ref" in schema:
        schema = _resolve(schema["$ref"])
    if depth > _MAX_DEPTH:
        p.add(path, "is nested too deeply", _fix(schema))
        return
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_TYPES[t](value) for t in names):
            p.add(path, f"is {kind(value)}, expected {' or '.join(names)}", _fix(schema))
            return
    if "enum" in schema and (isinstance(value, (dict, list)) or value not in schema["enum"]):
        p.add(path, f"{shown(value)} is not one of {', '.join(map(str, schema['enum']))}", _fix(schema))
        return
    if isinstance(value, str):
        _string(p, schema, value, path)
    elif isinstance(value, int) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            p.add(path, f"{value} is below {schema['minimum']}", _fix(schema))
        if "maximum" in schema and value > schema["maximum"]:
            p.add(path, f"{value} is above {schema['maximum']}", _fix(schema))
    elif isinstance(value, list):
        _array(p, schema, value, path, depth)
    elif isinstance(value, dict):
        _object(p, schema, value, path, depth)


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    """A schema ``pattern`` as JSON Schema (ECMA-262) means it, in Python's ``re``: a ``$`` outside
    a character class is the end of the text (``\\Z``), never "before a final newline" as Python's
    ``$`` is: ``"train\\n"`` is not a name."""
    out: list[str] = []
    in_class = escaped = False
    for ch in pattern:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        elif in_class:
            out.append(ch)
            in_class = ch != "]"
        elif ch == "[":
            out.append(ch)
            in_class = True
        else:
            out.append(r"\Z" if ch == "$" else ch)
    return re.compile("".join(out))


def _string(p: Problems, schema: dict[str, Any], value: str, path: str) -> None:
    if len(value) > schema.get("maxLength", 4096):
        p.add(path, f"is {len(value)} characters long, more than {schema.get('maxLength', 4096)}", _fix(schema))
    elif len(value) < schema.get("minLength", 0):
        p.add(path, "is empty", _fix(schema))
    elif "pattern" in schema and not _compiled(schema["pattern"]).search(value):
        p.add(path, f"{shown(value)} does not match {schema['pattern']}", _fix(schema))


def _array(p: Problems, schema: dict[str, Any], value: list[Any], path: str, depth: int) -> None:
    if len(value) > schema.get("maxItems", MAX_INSTANCES):
        p.add(path, f"has {len(value)} items, more than {schema.get('maxItems', MAX_INSTANCES)}", _fix(schema))
        return
    if len(value) < schema.get("minItems", 0):
        p.add(path, f"has fewer than {schema['minItems']} items", _fix(schema))
    items = schema.get("items")
    if items is not None:
        for i, item in enumerate(value):
            _walk(p, items, item, f"{path}[{i}]", depth + 1)


def _child(path: str, key: str) -> str:
    """A key's path: top-level keys are named alone (gpuprov_host.gpus[0], not (the file).gpuprov_host...)."""
    return key if path == ROOT else f"{path}.{key}"


def _object(p: Problems, schema: dict[str, Any], value: dict[Any, Any], path: str, depth: int) -> None:
    limit = schema.get("maxProperties", MAX_GPUS)
    if len(value) > limit:
        p.add(path, f"has {len(value)} keys, more than {limit}", _fix(schema))
        return
    if len(value) < schema.get("minProperties", 0):
        p.add(path, "is empty", _fix(schema))
    for key in schema.get("required", ()):
        if key not in value:
            p.add(_child(path, key), "is required", _fix(schema.get("properties", {}).get(key, schema)))
    properties = schema.get("properties", {})
    names = schema.get("propertyNames")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        where = _child(path, key) if isinstance(key, str) else f"{path}[{shown(key)}]"
        if not isinstance(key, str):
            p.add(where, f"the key {shown(key)} is not a string", "quote it")
            continue
        if names is not None:
            before = len(p.items)
            _walk(p, names, key, f"{path}: key {shown(key)}", depth + 1)
            if len(p.items) > before:
                continue
        if key in properties:
            _walk(p, properties[key], item, where, depth + 1)
        elif extra is False:
            known = ", ".join(properties) or "none"
            p.add(where, "is not a known key", f"known keys here: {known}")
        elif isinstance(extra, dict):
            _walk(p, extra, item, where, depth + 1)


def check(value: Any, path: str, definition: str | None = None) -> Problems:
    """Every problem of ``value`` against the schema (or its ``$defs`` entry ``definition``)."""
    p = Problems()
    _walk(p, SCHEMA if definition is None else _resolve(f"#/$defs/{definition}"), value, path, 0)
    return p
