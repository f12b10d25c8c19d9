"""NVIDIA's layout files read as gpuprov layouts: mig-parted's ``mig-configs`` and
vgpu-device-manager's ``vgpu-configs``.

Each named config becomes a named layout ``{"gpus": [GPU entries]}`` of the host model
(``gpuprov_layouts``): ``devices: all`` -> ``select: all`` (or the ``device-filter``'s
``vendor:device``), ``devices: [N, ...]`` -> one entry per index (``select: {index: N}``,
the index mig-parted and nvidia-smi count: NVIDIA GPUs in PCI address order).
What is accepted, what is refused and why: docs/reference/formats.md.

Pure functions over plain data (a parsed YAML document, maybe hostile): every problem is a
:class:`~gpuprov.core.plan.Refusal` naming the config and the field, never an exception;
every collection is bounded before it is iterated. Nothing is returned when anything is
refused (fail closed: half a layout file is not the file). Ships to targets with the
modules; standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.plan import Refusal
from ..inputs.declaration import (
    FORMAT_VERSION,
    LAYOUT_NAME,
    MAX_KEYS_OF_ENTRY,
    MAX_LAYOUTS,
    MAX_PROFILES,
    MIG_PROFILE_ATTR,
    VGPU_MIG_BACKED,
    VGPU_TIME_SLICED,
    VGPU_USES,
)
from ..inputs.validate import (
    MAX_GPUS,
    MAX_INSTANCES,
    MAX_MIG_INSTANCES,
    Problems,
    boolean,
    integer,
    kind,
    mapping,
    sequence,
    shown,
    text,
)

# FORMAT_VERSION: the only version either tool defines. The patterns and limits are the
# declaration schema's (gpuprov.inputs.declaration), which describes these files too.
MAX_CONFIGS = MAX_LAYOUTS  # named configs in one file
# GPU entries made from one file: index lists multiply (1,024 configs x 1,024 indices would
# be a million entries from a document Ansible parsed without gpuprov's YAML bounds).
MAX_ENTRIES = 65536
MAX_ENTRY_KEYS = MAX_KEYS_OF_ENTRY  # keys of one mapping with known keys: the unknown ones are named, so bounded first
# A layout's name as mig-parted and vgpu-device-manager write theirs ("all-1g.10gb", "A100-4C").
# Entry names are made here from "mig"/"host"/"vgpu" and the selector ("mig-0", "vgpu-all"):
# they meet the host model's rule for a GPU's name, ^[a-z][a-z0-9_-]{0,31}$.
LAYOUT_NAME_RE = re.compile(LAYOUT_NAME)  # the host model's rule for a layout's name

# A device-filter is what NVML reports as the PCI device id: "0x" + device + vendor
# (mig-parted's types.NewDeviceIDFromString), "0x20B010DE" is 10de:20b0.
_DEVICE_FILTER_RE = re.compile(r"0[xX]([0-9A-Fa-f]{4})([0-9A-Fa-f]{4})")
NVIDIA_VENDOR = "10de"
# A MIG profile as nvidia-smi names GPU instance profiles ("1g.10gb", "1g.10gb+me",
# "1g.24gb+me.all", "1g.24gb-me"); mig-parted also takes "Cc.Gg.Mgb" (a compute instance
# of C slices in a GPU instance of G), which gpuprov takes only when C == G.
_MIG_PROFILE_RE = re.compile(rf"(?:(?P<c>[1-8])c\.)?(?P<g>[1-8])g\.(?P<gb>[0-9]{{1,4}})gb(?P<attr>{MIG_PROFILE_ATTR})?")
# vgpu-device-manager's type names (pkg/types/vgpu_type.go): time-sliced "A100-4C",
# "A100D-80C", "M60-0Q"; MIG-backed "A100-1-5C", "A100-1-5CME". The same GPU never takes both.
_VGPU_TIME_SLICED_RE = re.compile(VGPU_TIME_SLICED)
_VGPU_MIG_BACKED_RE = re.compile(VGPU_MIG_BACKED)

_MIG_ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")
_VGPU_ENTRY_KEYS = ("devices", "device-filter", "vgpu-devices")


@dataclass(frozen=True)
class _Target:
    """The GPUs one config entry takes: an index, or all (of one vendor:device, or every one)."""

    index: int | None = None  # None: devices: all
    device: str | None = None  # "10de:20b0": the device-filter's id

    @property
    def select(self) -> str | dict[str, int]:
        if self.index is not None:
            return {"index": self.index}
        return self.device or "all"

    def suffix(self) -> str:
        if self.index is not None:
            return str(self.index)
        return "all" if self.device is None else "all-" + self.device.replace(":", "-")

    def describe(self) -> str:
        if self.index is not None:
            return f"GPU {self.index}"
        return "all GPUs" if self.device is None else f"every {self.device} GPU"


# ---------------------------------------------------------------- recognising a file


def _is_format(doc: Any, key: str) -> bool:
    return isinstance(doc, dict) and doc.get("version") == FORMAT_VERSION and key in doc


def is_mig_parted(doc: Any) -> bool:
    """A mig-parted config file: a mapping with ``version: v1`` and ``mig-configs``."""
    return _is_format(doc, "mig-configs")


def is_vgpu_device_manager(doc: Any) -> bool:
    """A vgpu-device-manager config file: a mapping with ``version: v1`` and ``vgpu-configs``."""
    return _is_format(doc, "vgpu-configs")


# ---------------------------------------------------------------- the two formats


def layouts_from_mig_parted(doc: Any) -> tuple[dict[str, dict[str, Any]], list[Refusal]]:
    """mig-parted's ``mig-configs`` -> ``{config name: {"gpus": [GPU entries]}}``, or every problem.

    ``mig-enabled: false`` -> ``use: host``; ``true`` -> ``use: mig`` with ``mig: {profile: count}``
    (``mig: {}`` for an empty ``mig-devices``: MIG mode on, no instances)."""

    def fields(p: Problems, where: str, item: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        enabled = boolean(p, f"{where}.mig-enabled", item["mig-enabled"])
        profiles = _mig_devices(p, where, item, enabled)
        if enabled is None or profiles is None:
            return None
        return ("mig", {"use": "mig", "mig": profiles}) if enabled else ("host", {"use": "host"})

    return _layouts(doc, "mig-configs", "mig-parted", _MIG_ENTRY_KEYS, ("devices", "mig-enabled"), fields)


def layouts_from_vgpu_device_manager(doc: Any, use: str = "mdev") -> tuple[dict[str, dict[str, Any]], list[Refusal]]:
    """vgpu-device-manager's ``vgpu-configs`` -> ``{config name: {"gpus": [GPU entries]}}``, or every problem.

    Each entry: ``use: mdev`` with ``instances: {type: count}``. vgpu-device-manager writes the
    same counts for every GPU; on an SR-IOV GPU (Ampere and later) they are VF vGPUs, which the
    host model calls ``use: sriov_vgpu``: the caller, who knows the host's GPUs, passes
    ``use="sriov_vgpu"`` then (docs/reference/formats.md)."""
    if use not in VGPU_USES:
        raise ValueError(f"use must be one of {', '.join(VGPU_USES)}, not {use!r}")

    def fields(p: Problems, where: str, item: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        instances = _vgpu_devices(p, where, item["vgpu-devices"])
        return None if instances is None else ("vgpu", {"use": use, "instances": instances})

    return _layouts(doc, "vgpu-configs", "vgpu-device-manager", _VGPU_ENTRY_KEYS, ("devices", "vgpu-devices"), fields)


# What one entry makes of its GPUs: (name prefix, the fields after name and select), or None
# when the entry was refused (its problems told to the Problems).
_Fields = Callable[[Problems, str, dict[str, Any]], "tuple[str, dict[str, Any]] | None"]


def _layouts(
    doc: Any, key: str, tool: str, known: tuple[str, ...], required: tuple[str, ...], fields: _Fields
) -> tuple[dict[str, dict[str, Any]], list[Refusal]]:
    """Each config of the file -> a layout, one GPU entry per GPU each of its entries takes."""
    p = Problems()
    layouts: dict[str, dict[str, Any]] = {}
    total = 0
    for name, path, items in _configs(p, doc, key, tool):
        gpus: list[dict[str, Any]] = []
        claims = _Claims()
        for i, item in enumerate(items):
            where = f"{path}[{i}]"
            item = _entry_mapping(p, where, item, known, required)
            if item is None:
                continue
            targets = _targets(p, where, item)
            made = fields(p, where, item)
            if targets is None or made is None:
                continue
            total += len(targets)
            if total > MAX_ENTRIES:
                p.add(where, f"the file makes more than {MAX_ENTRIES} GPU entries", "split it into several files")
                return {}, p.items
            prefix, rest = made
            for target in targets:
                if not claims.take(p, where, target):
                    break  # one clash told per entry, not one per index
                # Each GPU its own mappings (of whole numbers): the caller may edit one entry.
                entry = {"name": f"{prefix}-{target.suffix()}", "select": target.select}
                entry.update({k: dict(v) if isinstance(v, dict) else v for k, v in rest.items()})
                gpus.append(entry)
        layouts[name] = {"gpus": gpus}
    return ({}, p.items) if p else (layouts, [])


# ---------------------------------------------------------------- shared parts


def _bounded_mapping(
    p: Problems, path: str, value: Any, max_keys: int, known: tuple[str, ...] | None = None
) -> dict[Any, Any] | None:
    """A mapping of at most ``max_keys`` keys, counted before any key is looked at."""
    if isinstance(value, dict) and len(value) > max_keys:
        p.add(path, f"has {len(value)} keys, more than {max_keys}", f"give at most {max_keys}")
        return None
    return mapping(p, path, value, known)


def _configs(p: Problems, doc: Any, key: str, tool: str) -> list[tuple[str, str, list[Any]]]:
    """The file's named configs: (name, path for messages, its entries), each checked for shape."""
    top = _bounded_mapping(p, "(the file)", doc, MAX_ENTRY_KEYS, ("version", key))
    if top is None:
        return []
    if top.get("version") != FORMAT_VERSION:
        p.add("version", f"must be {FORMAT_VERSION}, not {kind(top.get('version'))}", f"{tool} files say version: v1")
    if key not in top:
        p.add("(the file)", f"has no {key}", f"a {tool} file maps each config name to its list under {key}")
        return []
    configs = _bounded_mapping(p, key, top[key], MAX_CONFIGS)
    if configs is None:
        return []
    if not configs:
        p.add(key, "is empty", "give at least one named config")
    out = []
    for raw_name, items in configs.items():
        name = text(
            p,
            f"{key}[{shown(raw_name)}]",
            raw_name,
            max_len=63,
            pattern=LAYOUT_NAME_RE,
            what="config name",
            rule="a config (layout) name is 1 to 63 letters, digits and _.+-, starting with a letter or digit",
        )
        path = f"{key}.{name if name is not None else shown(raw_name)}"
        entries = sequence(p, path, items, MAX_GPUS)
        if entries is not None and not entries:
            p.add(path, "has no entries", "give at least one entry (- devices: all ...)")
        if name is not None and entries:
            out.append((name, path, entries))
    return out


def _entry_mapping(
    p: Problems, where: str, item: Any, known: tuple[str, ...], required: tuple[str, ...]
) -> dict[str, Any] | None:
    entry = _bounded_mapping(p, where, item, MAX_ENTRY_KEYS, known)
    if entry is None:
        return None
    missing = [k for k in required if k not in entry]
    if missing:
        p.add(where, f"has no {', '.join(missing)}", f"each entry gives {', '.join(required)}")
        return None
    if any(k not in known for k in entry):
        return None  # mapping() named the unknown keys
    return entry


def _targets(p: Problems, where: str, item: dict[str, Any]) -> list[_Target] | None:
    """``devices`` and ``device-filter`` -> the GPUs the entry takes, in the file's order."""
    devices = item["devices"]
    devices_rule = "devices: all, or a list of GPU indices ([0, 1]: nvidia-smi's numbering)"
    filters = _device_filters(p, f"{where}.device-filter", item.get("device-filter"))
    if devices == "all":
        if filters is None:
            return None
        return [_Target(device=f) for f in filters] or [_Target()]
    if not isinstance(devices, list):
        p.add(f"{where}.devices", f"must be all or a list of indices, not {kind(devices)}", devices_rule)
        return None
    indices = sequence(p, f"{where}.devices", devices, MAX_GPUS)
    if indices is None:
        return None
    if not indices:
        p.add(f"{where}.devices", "is an empty list", devices_rule)
        return None
    if filters:
        # mig-parted then skips a listed GPU of another id; a gpuprov entry by index has no
        # "skip": its id guard (expect) refuses instead, which would fail the hosts the filter spared.
        p.add(
            where,
            "gives both device-filter and a list of devices: the tools skip a listed GPU whose id "
            "the filter does not name, which no gpuprov entry expresses",
            "use devices: all with the device-filter, or drop the filter and add an expect guard "
            "to the converted entries",
        )
        return None
    out = []
    for j, raw in enumerate(indices):
        index = integer(p, f"{where}.devices[{j}]", raw, 0, MAX_GPUS - 1)
        if index is not None:
            out.append(_Target(index=index))
    return out if len(out) == len(indices) else None


def _device_filters(p: Problems, path: str, value: Any) -> list[str] | None:
    """``device-filter`` (a string or a list of them; absent or empty: no filter) -> vendor:device ids."""
    if value is None or value == "" or (isinstance(value, list) and len(value) == 0):
        return []
    # One filter or a list of them; anything else is told as a filter that is not a string
    # (an unquoted 0x20B010DE is a number to YAML).
    single = not isinstance(value, list)
    raw = [value] if single else sequence(p, path, value, MAX_GPUS)
    if raw is None:
        return None
    rule = 'a PCI id as the tools write it, quoted, 0x + device + vendor: "0x20B010DE" is 10de:20b0'
    out: list[str] = []
    for j, item in enumerate(raw):
        where = path if single else f"{path}[{j}]"
        item = text(p, where, item, max_len=32, rule=rule)
        if item is None:
            return None
        if ":" in item:
            p.add(
                where,
                f"{shown(item)} names a subsystem: a gpuprov selector picks by vendor:device only",
                "filter by vendor:device here, and add an expect guard with the subsystem to the converted entries",
            )
            return None
        match = _DEVICE_FILTER_RE.fullmatch(item)
        if match is None:
            p.add(where, f"{shown(item)} is not a device id", rule)
            return None
        device, vendor = match[1].lower(), match[2].lower()
        if vendor != NVIDIA_VENDOR:
            p.add(where, f"{shown(item)} is vendor {vendor}, not NVIDIA ({NVIDIA_VENDOR})", rule)
            return None
        out.append(f"{vendor}:{device}")
    return out


class _Claims:
    """Which GPUs a config's entries have taken so far: each GPU gets one entry.

    The tools apply a config's entries in order (a later one redoes a GPU an earlier one did);
    a gpuprov layout gives each GPU one entry, so entries that may meet are refused. Kept as
    sets: a config of 1,024 entries is checked in linear time."""

    def __init__(self) -> None:
        self.every = False  # an unfiltered devices: all
        self.devices: set[str] = set()
        self.indices: set[int] = set()

    def take(self, p: Problems, where: str, target: _Target) -> bool:
        if target.index is not None:
            clash = self.every or bool(self.devices) or target.index in self.indices
            self.indices.add(target.index)
        elif target.device is not None:
            clash = self.every or bool(self.indices) or target.device in self.devices
            self.devices.add(target.device)
        else:
            clash = self.every or bool(self.devices) or bool(self.indices)
            self.every = True
        if clash:
            p.add(
                where,
                f"takes {target.describe()}, which an earlier entry of this config may take too: the tools apply "
                "both in order (the last wins), a gpuprov layout gives each GPU one entry",
                "give each GPU once: list indices, or device-filters that do not repeat, instead of all",
            )
        return not clash


def _mig_devices(p: Problems, where: str, item: dict[str, Any], enabled: bool | None) -> dict[str, int] | None:
    """``mig-devices`` -> {profile: count}; needed with mig-enabled true, refused with false."""
    path = f"{where}.mig-devices"
    value = item.get("mig-devices")
    if enabled is False:
        if value is not None and not (isinstance(value, dict) and len(value) == 0):
            p.add(path, "is given but mig-enabled is false", "set mig-enabled: true, or drop mig-devices")
            return None
        return {}
    if value is None:
        if enabled:
            p.add(path, "is missing (mig-enabled is true)", 'give the profiles, e.g. {"1g.10gb": 7}, or {} for none')
        return None
    found = _bounded_mapping(p, path, value, MAX_PROFILES)
    if found is None:
        return None
    rule = 'a GPU instance profile as nvidia-smi mig -lgip names it, e.g. "1g.10gb", "3g.40gb", "1g.10gb+me"'
    out: dict[str, int] = {}
    ok = True
    for raw, count in found.items():
        profile = text(p, f"{path}[{shown(raw)}]", raw, max_len=64, rule=rule)
        match = None if profile is None else _MIG_PROFILE_RE.fullmatch(profile)
        if profile is not None and match is None:
            p.add(f"{path}[{shown(profile)}]", "is not a MIG profile", rule)
        elif match is not None and match["c"] is not None and match["c"] != match["g"]:
            p.add(
                f"{path}[{shown(profile)}]",
                "is a compute-instance profile (fewer compute slices than its GPU instance): gpuprov makes "
                "each GPU instance with one compute instance over all of it",
                f"use the GPU instance profile {match['g']}g.{match['gb']}gb{match['attr'] or ''}",
            )
            match = None
        number = integer(p, f"{path}[{shown(raw)}]", count, 0, MAX_MIG_INSTANCES, " GPU instances")
        if match is None or number is None:
            ok = False
            continue
        name = f"{match['g']}g.{match['gb']}gb{match['attr'] or ''}"  # "2c.2g.10gb" is "2g.10gb"
        if name in out:
            p.add(f"{path}[{shown(profile)}]", f"repeats the profile {name}", "give each profile once, with its count")
            ok = False
            continue
        out[name] = number
    return out if ok else None


def _vgpu_devices(p: Problems, where: str, value: Any) -> dict[str, int] | None:
    """``vgpu-devices`` -> {type: count}, at most :data:`MAX_INSTANCES` on one GPU."""
    path = f"{where}.vgpu-devices"
    found = _bounded_mapping(p, path, value, MAX_PROFILES)
    if found is None:
        return None
    rule = 'a vGPU type as vgpu-device-manager names it: "A100-4C", "A10-24Q", MIG-backed "A100-1-5C"'
    out: dict[str, int] = {}
    kinds: set[str] = set()
    ok = True
    for raw, count in found.items():
        name = text(p, f"{path}[{shown(raw)}]", raw, max_len=64, rule=rule)
        if name is not None:
            if _VGPU_TIME_SLICED_RE.fullmatch(name):
                kinds.add("time-sliced")
            elif _VGPU_MIG_BACKED_RE.fullmatch(name):
                kinds.add("MIG-backed")
            else:
                p.add(f"{path}[{shown(name)}]", "is not a vGPU type name", rule)
                name = None
        number = integer(p, f"{path}[{shown(raw)}]", count, 0, MAX_INSTANCES, " vGPUs on one GPU")
        if name is None or number is None:
            ok = False
            continue
        out[name] = number
    if len(kinds) > 1:
        p.add(path, "mixes time-sliced and MIG-backed vGPU types", "one GPU runs either kind: split them over GPUs")
        ok = False
    if ok and sum(out.values()) > MAX_INSTANCES:
        p.add(path, f"asks {sum(out.values())} vGPUs of one GPU, more than {MAX_INSTANCES}", "lower the counts")
        ok = False
    return out if ok else None
