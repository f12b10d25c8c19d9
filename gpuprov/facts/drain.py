"""The drain record: which VMs gpuprov shut down before a reboot or a rebind, so that the restore after
it starts exactly those again (docs/guides/rolling.md). gpuprov writes it (:func:`record_text`,
through a plan's file action) and reads it back here; on read it is untrusted input: bounded in size
(:func:`~gpuprov.facts.boundedjson.loads_bounded`), its form checked key by key, and anything else is
:class:`RecordError`, which the drain and the restore refuse on, changing nothing.

Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

import json
import re
import stat as stat_
from dataclasses import dataclass, field

from .boundedjson import loads_bounded
from .host import HostFacts
from .sysfs import Sysfs

RECORD = "var/lib/gpuprov/drain.json"  # below the root
RECORD_VERSION = 1
MAX_RECORD_CHARS = 256 * 1024
MAX_STOPPED = 1024  # domains in one record
MAX_REASON = 4096
# libvirt's domain names are free text; the record takes printable ones without quotes or slashes.
_NAME = re.compile(r"[A-Za-z0-9_.+:@-][A-Za-z0-9_.+:@ -]{0,254}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class RecordError(ValueError):
    """The record is there but not one gpuprov wrote: the message says what is wrong with it."""


@dataclass
class StoppedDomain:
    name: str
    uuid: str


@dataclass
class DrainRecord:
    stopped: list[StoppedDomain] = field(default_factory=list)
    reason: str = ""

    def uuids(self) -> set[str]:
        return {d.uuid for d in self.stopped}


def record_text(record: DrainRecord) -> str:
    """The file as gpuprov writes it (what :func:`parse_record` reads back)."""
    doc = {
        "version": RECORD_VERSION,
        "reason": record.reason[:MAX_REASON],
        "stopped": [{"name": d.name, "uuid": d.uuid} for d in record.stopped],
    }
    return json.dumps(doc, indent=1) + "\n"


def name_ok(name: str) -> bool:
    """Whether a domain's name fits in a record."""
    return bool(_NAME.fullmatch(name))


def parse_record(text: str) -> DrainRecord:
    """The record in ``text``, or :class:`RecordError` saying what is wrong with it."""
    try:
        doc = loads_bounded(text, max_chars=MAX_RECORD_CHARS, max_depth=4)
    except ValueError as exc:
        raise RecordError(f"not JSON gpuprov wrote ({exc})") from None
    if not isinstance(doc, dict) or set(doc) != {"version", "reason", "stopped"}:
        raise RecordError("not an object with exactly version, reason and stopped")
    if doc["version"] != RECORD_VERSION or isinstance(doc["version"], bool):
        raise RecordError(f"version is not {RECORD_VERSION}")
    reason, stopped = doc["reason"], doc["stopped"]
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise RecordError(f"reason is not a text of at most {MAX_REASON} characters")
    if not isinstance(stopped, list) or len(stopped) > MAX_STOPPED:
        raise RecordError(f"stopped is not a list of at most {MAX_STOPPED} domains")
    out: list[StoppedDomain] = []
    for i, entry in enumerate(stopped):
        if not isinstance(entry, dict) or set(entry) != {"name", "uuid"}:
            raise RecordError(f"stopped[{i}] is not an object with exactly name and uuid")
        name, uuid = entry["name"], entry["uuid"]
        if not isinstance(name, str) or not name_ok(name):
            raise RecordError(f"stopped[{i}].name is not a domain name")
        if not isinstance(uuid, str) or not _UUID.fullmatch(uuid):
            raise RecordError(f"stopped[{i}].uuid is not a lower-case UUID")
        if uuid in {d.uuid for d in out}:
            raise RecordError(f"stopped[{i}].uuid is listed twice")
        out.append(StoppedDomain(name, uuid))
    return DrainRecord(stopped=out, reason=reason)


def read_record(sysfs: Sysfs) -> DrainRecord | None:
    """The record below the root; None when there is none; :class:`RecordError` when it is there but
    cannot be read, is not a regular file, or is not one gpuprov wrote."""
    st = sysfs.stat(RECORD)
    if st is None:
        if sysfs.exists(RECORD):
            raise RecordError("it is there but cannot be read")
        return None
    if not stat_.S_ISREG(st.st_mode):
        raise RecordError("it is not a regular file")
    if st.st_size > MAX_RECORD_CHARS:
        raise RecordError(f"it is larger than {MAX_RECORD_CHARS} bytes")
    raw = sysfs.read_bytes(RECORD)
    if raw is None:
        raise RecordError("it is there but cannot be read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RecordError("it is not UTF-8") from None
    return parse_record(text)


def recorded(sysfs: Sysfs) -> bool:
    """Whether a record is there (read or not): the restore has something to do or say."""
    return sysfs.stat(RECORD) is not None or sysfs.exists(RECORD)


def as_dict(record: DrainRecord | None) -> list[dict[str, str]]:
    """The stopped domains, as a result shows them."""
    return [] if record is None else [{"name": d.name, "uuid": d.uuid} for d in record.stopped]


def device_parents(facts: HostFacts) -> dict[str, str]:
    """Device -> the device it hangs below: an mdev's UUID -> its parent, a VF -> its PF."""
    out = {m.uuid.lower(): m.parent for m in facts.mdevs if m.parent}
    out.update({addr: dev.physfn for addr, dev in facts.pci.items() if dev.physfn})
    return out
