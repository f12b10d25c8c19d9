"""The rules every value from an inventory, a host_vars file or a module option meets.

Small typed checkers, one per kind of field, each taking the field's path
(``gpu_vms_list[2].cpuset``), adding a problem that names that path and the fix
to a :class:`Problems`, and returning the typed value (``None`` when it is
refused). Types are real: a boolean is YAML ``true``/``false`` (the string
``"false"`` is an error, never true), a whole number is an ``int`` (never a
bool), sizes are never negative and every range has an upper bound, CPU lists
are bounded before anything is expanded. Names follow libvirt's and the
kernel's rules, and no free text holds a control character. The per-input
functions (a host_vars file, gpu_vm's and gpu_vgpu's options) are in
:mod:`gpuprov.inputs.boundary`; every rule and limit here is listed in
docs/reference/inputs.md.

Pure (the ROM file's check below a root is gpuprov.facts.vm_storage.rom_file_problem). Ships to
targets with the modules; standard library only.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from typing import Any

from ..core.plan import Refusal
from ..core.vm_spec import ROM_DIR
from ..facts.numa import MAX_CPUS
from ..facts.pci import PciAddressError, normalize_address
from .hostroot import shown

# Limits (docs/reference/inputs.md, "Limits"); MAX_CPUS bounds facts and inputs alike.
MAX_VCPUS = 4096  # QEMU's q35 maximum
MAX_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB per VM, and for the memory kept for the host
MAX_NUMA_NODE = 1023  # Linux MAX_NUMNODES is at most 1024
MAX_DISK_GIB = 1 << 20  # 1 PiB
MAX_VGPU_TYPE = 65535
MAX_SECONDS = 86400
MAX_VMS = 4096  # VMs in one host's list
MAX_GPUS = 1024  # entries of gpuprov_gpus
MAX_DEVICES = 64  # gpus, vfs or mdevs of one VM (each takes a pcie-root-port)
MAX_INSTANCES = 256  # mdevs or vGPUs declared on one GPU
MAX_MIG_INSTANCES = 7  # GPU instances of one MIG profile on one GPU (A100/H100: at most 7)
MAX_KEYS = 256  # SSH keys of one guest user
MAX_PACKAGES = 1024
MAX_PATH = 4095  # PATH_MAX - 1
MAX_CMDLINE = 2048  # x86 COMMAND_LINE_SIZE
MAX_SSH_KEY = 16384
MAX_TEXT = 255  # any other short text (a type name, a URI)

# GPU option ROMs come from this one directory (a regular file in it, no `..`, no symlink
# that leaves it): libvirt gives QEMU the file named in <rom file=...>, read as root.

SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ssh-dss",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)

# libvirt domain names become file names (the overlay, the seed, the serial log) and host names.
VM_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}")
# A libvirt network's name: the interface-name alphabet (no '/', space, ':' or control character).
NETWORK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}")
MACHINE_RE = re.compile(r"[a-z0-9._-]{1,64}")
MAC_RE = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
HOSTNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")
PACKAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9+._:=~-]{0,127}")
VENDOR_ID_RE = re.compile(r"[A-Za-z0-9]{1,12}")
# An mdev parent that is not a PCI device (the mtty sample) and an mdev type directory: sysfs names.
SYSFS_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
# A vGPU/mdev type as given: its directory name (nvidia-259) or its name ("GRID V100-8Q"), never a path.
TYPE_REF_RE = re.compile(r"[^/]{1,255}")
_CPU_RANGE_RE = re.compile(r"(\d{1,5})(?:-(\d{1,5}))?")


def kind(value: Any) -> str:
    """What a value is, in words, for a message ("the string 'false'", "a list")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {shown(value)}"
    if isinstance(value, str):
        return f"the {'Jinja template' if _is_template(value) else 'string'} {shown(value)}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


class Problems:
    """Every problem of one input, each naming its field path and the fix."""

    def __init__(self) -> None:
        self.items: list[Refusal] = []
        self._seen: set[str] = set()  # a default's problem is told once, not once per VM

    def add(self, path: str, message: str, fix: str | None = None) -> None:
        refusal = Refusal(f"{path}: {message}", fix)
        if refusal.message not in self._seen:
            self._seen.add(refusal.message)
            self.items.append(refusal)

    def __bool__(self) -> bool:
        return bool(self.items)


def _is_template(value: str) -> bool:
    return "{{" in value or "{%" in value


TEMPLATE_FIX = (
    "gpuprov plan reads the file as written and renders no Jinja: put the value itself here "
    "(the role's modules check the rendered value)"
)


def _control_character(text: str) -> str | None:
    """The first character of ``text`` that is not printable (control, format, separator...)."""
    for ch in text:
        if not ch.isprintable():
            return ch
    return None


# ---------------------------------------------------------------- scalars


def boolean(p: Problems, path: str, value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
        word = "true" if value.strip().lower() in ("true", "yes", "on", "1") else "false"
        p.add(path, f"must be a boolean, not {kind(value)}", f"write {word} without quotes")
    else:
        p.add(path, f"must be true or false, not {kind(value)}", "write true or false without quotes")
    return None


def integer(p: Problems, path: str, value: Any, lo: int, hi: int, unit: str = "") -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        fix = f"a whole number from {lo} to {hi}{unit}"
        if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 20:
            fix = f"write {value.strip()} without quotes ({fix})"
        p.add(path, f"must be a whole number, not {kind(value)}", fix)
        return None
    if not lo <= value <= hi:
        p.add(path, f"{shown(value)} is out of range", f"give a whole number from {lo} to {hi}{unit}")
        return None
    return value


def choice(p: Problems, path: str, value: Any, choices: tuple[str, ...]) -> str | None:
    if not isinstance(value, str) or value not in choices:
        p.add(path, f"must be one of {', '.join(choices)}, not {kind(value)}", f"write one of {', '.join(choices)}")
        return None
    return value


def text(
    p: Problems,
    path: str,
    value: Any,
    *,
    max_len: int = MAX_TEXT,
    pattern: re.Pattern[str] | None = None,
    rule: str = "",
    what: str = "value",
) -> str | None:
    """A string: printable (no control character, no line break), at most ``max_len``, matching ``pattern``."""
    if not isinstance(value, str):
        hint = " (YAML read it as a number: quote it)" if isinstance(value, (int, float)) else ""
        p.add(path, f"must be a string, not {kind(value)}{hint}", rule or "give a string")
        return None
    if _is_template(value):
        p.add(path, f"{shown(value)} is a Jinja template", TEMPLATE_FIX)
        return None
    bad = _control_character(value)
    if bad is not None:
        p.add(
            path,
            f"{shown(value)} holds the non-printable character {bad!r}",
            f"remove it (one line, printable). {rule}",
        )
        return None
    if len(value) > max_len:
        p.add(path, f"is {len(value)} characters long, more than {max_len}", rule or f"at most {max_len} characters")
        return None
    if pattern is not None and not pattern.fullmatch(value):
        p.add(path, f"{shown(value)} is not a valid {what}", rule or "see docs/reference/inputs.md")
        return None
    return value


def path_text(p: Problems, path: str, value: Any) -> str | None:
    """An absolute, normalized path on the host: no ``..``, ``.`` or ``//``, no control character."""
    value = text(p, path, value, max_len=MAX_PATH)
    if value is None:
        return None
    if not value.startswith("/") or value.startswith("//") or posixpath.normpath(value) != (value.rstrip("/") or "/"):
        p.add(path, f"{shown(value)} is not an absolute, normalized path", "write it as /dir/file, without .. or //")
        return None
    return value


# ---------------------------------------------------------------- names and identifiers


def vm_name(p: Problems, path: str, value: Any) -> str | None:
    return text(
        p,
        path,
        value,
        pattern=VM_NAME_RE,
        what="VM name",
        rule="a VM name is 1 to 63 letters, digits and _.+-, starting with a letter or digit "
        "(the libvirt domain's name, also its files' and host name)",
    )


def network_name(p: Problems, path: str, value: Any) -> str | None:
    return text(
        p,
        path,
        value,
        pattern=NETWORK_RE,
        what="network name",
        rule="a libvirt network name: 1 to 63 letters, digits and _.+- (see `virsh net-list --all`)",
    )


def machine_type(p: Problems, path: str, value: Any) -> str | None:
    return text(
        p,
        path,
        value,
        pattern=MACHINE_RE,
        what="machine type",
        rule="a QEMU machine type: lower-case letters, digits and ._- (q35)",
    )


def cmdline(p: Problems, path: str, value: Any) -> str | None:
    return text(p, path, value, max_len=MAX_CMDLINE, rule=f"one line of at most {MAX_CMDLINE} characters")


def mac_address(p: Problems, path: str, value: Any) -> str | None:
    rule = "a unicast MAC, six lower-case hex pairs, e.g. 52:54:00:12:34:56 (quoted: YAML reads it as a number)"
    value = text(p, path, value, max_len=17, rule=rule)
    if value is None:
        return None
    mac = value.lower()
    if not MAC_RE.fullmatch(mac):
        p.add(path, f"{shown(value)} is not a MAC address", rule)
        return None
    if int(mac[:2], 16) & 1:
        p.add(path, f"{mac} is a multicast address (the first byte is odd)", rule)
        return None
    if mac == "00:00:00:00:00:00":
        p.add(path, "00:00:00:00:00:00 is not a NIC's address", rule)
        return None
    return mac


def uuid_text(p: Problems, path: str, value: Any) -> str | None:
    rule = "a UUID in its canonical form, e.g. 7b0b3d34-0c4c-4c7e-9a51-2a3f2f7c9e10 (or leave it out)"
    value = text(p, path, value, max_len=64, rule=rule)
    if value is None:
        return None
    if not UUID_RE.fullmatch(value.lower()):
        p.add(path, f"{shown(value)} is not a UUID", rule)
        return None
    return value.lower()


def pci_address(p: Problems, path: str, value: Any) -> str | None:
    rule = 'the full PCI address, quoted, e.g. "0000:41:00.0" (`lspci -D`)'
    value = text(p, path, value, max_len=32, rule=rule)
    if value is None:
        return None
    try:
        return normalize_address(value)
    except PciAddressError as exc:
        p.add(path, str(exc), rule)
        return None


def ssh_key(p: Problems, path: str, value: Any) -> str | None:
    """One public key: ``TYPE BASE64 [comment]`` on one line, its blob naming the same type."""
    rule = "one public key per entry, one line: TYPE BASE64 [comment] (the line of a .pub file)"
    if isinstance(value, str):
        value = value.strip()
        if "\n" in value or "\r" in value:
            p.add(path, "holds more than one line", "one key per entry: split it into separate list entries")
            return None
    value = text(p, path, value, max_len=MAX_SSH_KEY, rule=rule)
    if value is None:
        return None
    parts = value.split(None, 2)
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        p.add(path, f"{shown(value)} does not start with a key type", f"{rule}; types: {', '.join(SSH_KEY_TYPES)}")
        return None
    key_type, body = parts[0], parts[1]
    try:
        blob = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        p.add(path, f"the key body of {shown(value)} is not base64", rule)
        return None
    name = key_type.encode()
    if blob[:4] != len(name).to_bytes(4, "big") or blob[4 : 4 + len(name)] != name:
        p.add(path, f"the key body is not a {key_type} key", rule)
        return None
    return value


def rom(p: Problems, path: str, value: Any) -> str | None:
    """``on``/``off`` (or a boolean), or the path of a ROM file in :data:`ROM_DIR`."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value in ("on", "off"):
        return str(value)
    value = path_text(p, path, value)
    if value is None:
        return None
    if not value.startswith(ROM_DIR + "/"):
        p.add(path, f"{shown(value)} is not in {ROM_DIR}", f"copy the ROM file into {ROM_DIR}/ and name it there")
        return None
    return value


def cpu_list(p: Problems, path: str, value: Any, cpu_limit: int | None = None) -> list[int] | None:
    """``"0-3,8"``, a list of CPU numbers, or one number -> the CPUs, each once.

    Every number is checked against ``cpu_limit`` (the host's CPU count, when
    known) and :data:`MAX_CPUS` before a range is expanded.
    """
    limit = min(cpu_limit, MAX_CPUS) if cpu_limit else MAX_CPUS
    where = f"this host's CPUs (0-{limit - 1})" if cpu_limit else f"0-{MAX_CPUS - 1}"
    rule = f"a CPU list such as '0-3,8' or [0, 1], within {where}"
    if isinstance(value, bool):
        p.add(path, f"must be a CPU list, not {kind(value)}", rule)
        return None
    if isinstance(value, int):
        value = [value]
    cpus: list[int] = []
    if isinstance(value, str):
        if len(value) > MAX_TEXT * 16:
            p.add(path, f"is {len(value)} characters long", rule)
            return None
        for part in value.split(","):
            part = part.strip()
            if not part and value.strip() == "":
                break
            match = _CPU_RANGE_RE.fullmatch(part)
            if match is None:
                where_in = "" if part == value.strip() else f" in {shown(value)}"
                p.add(path, f"{shown(part)}{where_in} is not a CPU number or range", rule)
                return None
            lo, hi = int(match[1]), int(match[2] or match[1])
            if hi < lo or hi >= limit:
                p.add(path, f"{part} is outside {where}", rule)
                return None
            if len(cpus) + hi - lo + 1 > limit:
                p.add(path, f"{shown(value)} names more CPUs than {where}", rule)
                return None
            cpus.extend(range(lo, hi + 1))
    elif isinstance(value, list):
        if len(value) > limit:
            p.add(path, f"names {len(value)} CPUs, more than {where}", rule)
            return None
        for i, cpu in enumerate(value):
            if isinstance(cpu, bool) or not isinstance(cpu, int) or not 0 <= cpu < limit:
                p.add(f"{path}[{i}]", f"{kind(cpu)} is not a CPU number within {where}", rule)
                return None
            cpus.append(cpu)
    else:
        p.add(path, f"must be a CPU list, not {kind(value)}", rule)
        return None
    if len(set(cpus)) != len(cpus):
        p.add(path, f"{shown(value)} names a CPU twice", rule)
        return None
    return cpus


# ---------------------------------------------------------------- collections


def mapping(p: Problems, path: str, value: Any, known: tuple[str, ...] | None = None) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        p.add(path, f"must be a mapping, not {kind(value)}", f"keys: {', '.join(known)}" if known else "give a mapping")
        return None
    if known is not None:
        unknown = sorted(shown(k) if not isinstance(k, str) else k for k in value if k not in known)
        if unknown:
            p.add(path, f"unknown keys {', '.join(unknown)}", f"known keys: {', '.join(known)}")
    return value


def sequence(p: Problems, path: str, value: Any, max_items: int) -> list[Any] | None:
    if not isinstance(value, list):
        p.add(path, f"must be a list, not {kind(value)}", "give a YAML list (- item, or [a, b])")
        return None
    if len(value) > max_items:
        p.add(path, f"has {len(value)} entries, more than {max_items}", f"give at most {max_items}")
        return None
    return value
