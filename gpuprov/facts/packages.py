"""Which distribution packages and systemd services a host has, read without Ansible's
``package``/``service`` modules (each a module run of its own, seconds per task on a fleet):
dpkg's status file read as a file, ``rpm --query`` and one ``systemctl show`` on the live root.

Fail closed: what cannot be read is unknown (``None``), and a planner treats unknown as
missing (an install or ``systemctl enable --now`` it plans is idempotent).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

from .mig import Runner, run_command
from .sysfs import MAX_READ_BYTES, Sysfs

DPKG_STATUS = "var/lib/dpkg/status"
RPM_PATHS = ("usr/bin/rpm", "bin/rpm")
# Debian's and RPM's package-name characters: a name given here ends up in an install argv.
PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]{0,127}$")
# systemd unit names: name.service, name.socket ...
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.@-]{1,200}\.(service|socket|target|timer|path)$")


# dpkg's status file, read without a Python loop over its lines: a real one is 1-5 MiB
# (thousands of stanzas), a hostile one may be 16 MiB of blank lines. Each pattern stays on
# one line or one run of blank lines, so every search is linear, and the searches move forward.
_STANZA_END = re.compile(r"\n(?:[ \t\r]*\n)+")  # a blank line (or one of blanks) ends a stanza
_PACKAGE_FIELD = re.compile(r"^Package[ \t]*:([^\n]*)", re.M)
_STATUS_FIELD = re.compile(r"^Status[ \t]*:([^\n]*)", re.M)
_VERSION_FIELD = re.compile(r"^Version[ \t]*:([^\n]*)", re.M)


def dpkg_installed(sysfs: Sysfs) -> dict[str, str] | None:
    """Installed package -> version from dpkg's status file; None when there is none (no dpkg),
    it cannot be read, or it is larger than a read (MAX_READ_BYTES): unknown, not a partial list.
    A stanza without a Package or an installed Status is skipped; nothing raises."""
    raw = sysfs.read_bytes(DPKG_STATUS)
    if raw is None or len(raw) >= MAX_READ_BYTES:
        return None
    text = raw.decode("utf-8", "replace")
    found: dict[str, str] = {}
    pos = 0
    while True:
        package = _PACKAGE_FIELD.search(text, pos)
        if package is None:
            return found
        # The stanza: from the blank line before its Package field to the blank line after.
        blank = text.rfind("\n\n", pos, package.start())
        start = pos if blank < 0 else blank + 1
        after = _STANZA_END.search(text, package.end())
        end = len(text) if after is None else after.start()
        pos = end if after is None else after.end()
        name = package.group(1).strip()
        status = _STATUS_FIELD.search(text, start, end)
        if name and status is not None and status.group(1).strip().endswith(" installed"):
            version = _VERSION_FIELD.search(text, start, end)
            found[name] = "" if version is None else version.group(1).strip()
        if after is None:
            return found


def rpm_installed(names: list[str], run: Runner) -> dict[str, str] | None:
    """Of ``names``, those rpm says are installed (name -> version); None when rpm failed."""
    try:
        out = run(["rpm", "--query", "--queryformat=%{NAME} %{VERSION}-%{RELEASE}\\n", *names])
    except (OSError, subprocess.SubprocessError):
        return None
    found: dict[str, str] = {}
    for line in out.splitlines():
        name, _sep, version = line.partition(" ")
        if name in names:  # "package X is not installed" lines name no package of ours first
            found[name] = version.strip()
    return found


@dataclass
class Packages:
    """What the package manager says is installed; ``installed`` None: unknown."""

    manager: str | None  # dpkg | rpm | None (neither found)
    installed: dict[str, str] | None

    def missing(self, names: list[str]) -> list[str]:
        """Of ``names``, those not known to be installed (all of them when that is unknown)."""
        if self.installed is None:
            return list(names)
        return [n for n in names if n not in self.installed]


def read_packages(sysfs: Sysfs, names: list[str], run: Runner | None = None) -> Packages:
    """Whether ``names`` are installed: dpkg's status file on any root, rpm only on the live root
    (or with ``run``; its database is no file to read)."""
    if sysfs.exists(DPKG_STATUS):
        return Packages("dpkg", dpkg_installed(sysfs))
    if any(sysfs.exists(p) for p in RPM_PATHS):
        if not names:
            return Packages("rpm", {})
        if sysfs.live or run is not None:
            return Packages("rpm", rpm_installed(names, run or run_command))
        return Packages("rpm", None)
    return Packages(None, None)


def install_argv(manager: str | None, names: list[str]) -> list[str]:
    """The command that installs ``names`` with the host's package manager (apt-get where it is
    dpkg or unknown: gpuprov's hosts are Debian, Ubuntu or the RHEL family)."""
    if manager == "rpm":
        return ["dnf", "-y", "install", *names]
    return ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", *names]


@dataclass
class Services:
    """systemd units' state; ``states`` None: unknown (no systemd answer)."""

    systemd: bool  # the host runs systemd (/run/systemd/system)
    states: dict[str, tuple[str, str]] | None = field(default=None)  # unit -> (ActiveState, UnitFileState)

    def not_running(self, units: list[str]) -> list[str]:
        """Of ``units``, those not known to be active and enabled."""
        if self.states is None:
            return list(units)
        return [u for u in units if not _running(self.states.get(u, ("", "")))]


def _running(state: tuple[str, str]) -> bool:
    # As Ansible's systemd module counts "started": active or on its way.
    active, unit_file = state
    return active in ("active", "activating", "reloading") and _enabled(unit_file)


def _enabled(state: str) -> bool:
    # enabled-runtime, static, indirect (socket-activated services), generated, alias: started
    # at boot by something; only these two are not.
    return state not in ("", "disabled", "masked", "masked-runtime", "linked", "linked-runtime", "bad")


def read_services(sysfs: Sysfs, units: list[str], run: Runner | None = None) -> Services:
    """ActiveState and UnitFileState of ``units`` with one ``systemctl show`` (live root or ``run``)."""
    systemd = sysfs.exists("run/systemd/system")
    if not systemd or not units or not (sysfs.live or run is not None):
        return Services(systemd, None if units else {})
    try:
        out = (run or run_command)(["systemctl", "show", "--property=Id,ActiveState,UnitFileState", "--", *units])
    except (OSError, subprocess.SubprocessError):
        return Services(systemd, None)
    states: dict[str, tuple[str, str]] = {}
    for block in out.split("\n\n"):
        props = dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
        unit = props.get("Id", "")
        if unit in units:
            states[unit] = (props.get("ActiveState", ""), props.get("UnitFileState", ""))
    return Services(systemd, states)
