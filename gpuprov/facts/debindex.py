"""Debian packages without apt: a .deb's control fields, an apt ``Packages`` index of an offline
directory, dpkg's status, Debian's version order, and what an install would still lack.

The guest toolkit module checks an offline directory against the guest's own dpkg status before
anything is written (docs/guides/air-gapped.md): every dependency that the guest lacks and the
directory does not hold is named in one refusal. The .debs are read on the controller (the role's
lookup ``gpuprov.kvm.offline_index``), as data: an ``ar`` archive whose ``control.tar`` member
holds ``./control``; nothing in a package is run. Every read is bounded.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import re
import tarfile
import zlib
from dataclasses import dataclass, field

from .files import NotRegular, TooLarge
from .files import read_regular as read_regular_file

# Debian Policy 5.6.1 (names), 5.6.12 (versions); what may reach an apt command line or a file.
DEB_NAME = re.compile(r"[a-z0-9][a-z0-9.+-]{1,127}")
DEB_VERSION = re.compile(r"(?:[0-9]{1,9}:)?[0-9][A-Za-z0-9.+~-]{0,127}")
DEB_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~_%-]{0,250}\.deb")
# A package file gpuprov copies from the controller to a guest: a plain name in the directory, never a path.
PACKAGE_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~_%-]{0,250}\.(?:deb|rpm)")
# apt's own fields of a Packages index: a package's control file that carries them is lying about where it is.
INDEX_FIELDS = ("Filename", "Size", "SHA256", "SHA1", "SHA512", "MD5sum")


def package_file_ok(name: str) -> bool:
    """Whether ``name`` may be copied from the offline directory to a guest (the one check of those names)."""
    return isinstance(name, str) and PACKAGE_FILE.fullmatch(name) is not None


SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_DEB = 512 << 20  # one package file
MAX_CONTROL = 1 << 20  # a control member, uncompressed
MAX_INDEX = 16 << 20  # a Packages index or dpkg's status
MAX_FILES = 4096  # files in an offline directory
_AR_MAGIC = b"!<arch>\n"


class DebError(ValueError):
    """A file that is not a .deb gpuprov can read (its path and why)."""


def parse_stanzas(text: str) -> list[dict[str, str]]:
    """RFC 822-style stanzas (dpkg's status, apt's Packages); continuation lines are joined.
    Linear in the text; fields are kept as given (callers check what they use)."""
    out: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    last = None
    for line in text[:MAX_INDEX].splitlines():
        if not line.strip():
            if fields:
                out.append(fields)
            fields, last = {}, None
        elif line[0] in " \t":
            if last is not None:
                fields[last] += "\n" + line.strip()
        else:
            key, sep, value = line.partition(":")
            if sep:
                last = key.strip()
                fields[last] = value.strip()
    if fields:
        out.append(fields)
    return out


# ---------------------------------------------------------------- versions


def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: non-digit runs by _order, digit runs by value."""
    i = j = 0
    while i < len(a) or j < len(b):
        first = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first:
                first = ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first:
            return first
    return 0


def _split(version: str) -> tuple[int, str, str]:
    epoch, _sep, rest = version.rpartition(":") if ":" in version else ("0", "", version)
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, "0"
    return (int(epoch) if epoch.isdigit() else 0), upstream, revision


def compare_versions(a: str, b: str) -> int:
    """<0, 0, >0 as Debian orders ``a`` against ``b`` (epoch, upstream, revision)."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return ea - eb
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def satisfies(version: str, relation: str | None, wanted: str | None) -> bool:
    if relation is None or wanted is None:
        return True
    c = compare_versions(version, wanted)
    return {"<<": c < 0, "<=": c <= 0, "=": c == 0, ">=": c >= 0, ">>": c > 0, "<": c <= 0, ">": c >= 0}.get(
        relation, False
    )


# ---------------------------------------------------------------- dependencies

_ATOM = re.compile(r"^\s*([a-z0-9][a-z0-9.+-]*)(?::[a-z0-9-]+)?\s*(?:\(\s*(<<|<=|=|>=|>>|<|>)\s*([^)\s]+)\s*\))?")


@dataclass(frozen=True)
class Atom:
    name: str
    relation: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        return self.name + (f" ({self.relation} {self.version})" if self.relation else "")


def parse_depends(text: str) -> list[list[Atom]]:
    """``a (>= 1) | b, c [amd64]`` -> [[a>=1, b], [c]]: each group needs one of its atoms."""
    groups = []
    for group in text.split(","):
        atoms = []
        for alternative in group.split("|"):
            m = _ATOM.match(alternative.split("[", 1)[0])
            if m:
                atoms.append(Atom(m.group(1), m.group(2), m.group(3)))
        if atoms:
            groups.append(atoms)
    return groups


@dataclass
class PackageSet:
    """Packages by name, and who provides a virtual name (name -> [(provider, version or None)])."""

    versions: dict[str, str] = field(default_factory=dict)
    provides: dict[str, list[tuple[str, str | None]]] = field(default_factory=dict)
    stanzas: dict[str, dict[str, str]] = field(default_factory=dict)

    def add(self, fields: dict[str, str]) -> None:
        name, version = fields.get("Package", ""), fields.get("Version", "")
        if not DEB_NAME.fullmatch(name) or not DEB_VERSION.fullmatch(version):
            return
        if name in self.versions and compare_versions(self.versions[name], version) >= 0:
            return
        self.versions[name], self.stanzas[name] = version, fields
        for group in parse_depends(fields.get("Provides", "")):
            for atom in group:
                self.provides.setdefault(atom.name, []).append((name, atom.version if atom.relation == "=" else None))

    def find(self, atom: Atom) -> str | None:
        """The package here that satisfies ``atom`` (a real one, or a provider), else None."""
        version = self.versions.get(atom.name)
        if version is not None and satisfies(version, atom.relation, atom.version):
            return atom.name
        for provider, provided in self.provides.get(atom.name, []):
            if atom.relation is None or (provided is not None and satisfies(provided, atom.relation, atom.version)):
                return provider
        return None


def installed_set(status_text: str) -> PackageSet:
    """dpkg's status: the packages whose state is "install ok installed"."""
    found = PackageSet()
    for fields in parse_stanzas(status_text):
        if fields.get("Status", "").split()[-1:] == ["installed"]:
            found.add(fields)
    return found


def index_set(index_text: str) -> PackageSet:
    found = PackageSet()
    for fields in parse_stanzas(index_text):
        found.add(fields)
    return found


@dataclass
class Missing:
    needs: str  # the dependency as written (one group: "a (>= 1) | b")
    by: str  # the package that needs it


def missing_dependencies(
    wanted: list[str], installed: PackageSet, offline: PackageSet
) -> tuple[list[str], list[Missing]]:
    """What installing ``wanted`` from ``offline`` on a guest with ``installed`` takes: the packages
    apt would install from the directory, and each Depends/Pre-Depends group nothing satisfies."""
    to_install: list[str] = []
    missing: list[Missing] = []
    seen: set[str] = set()
    queue = [(Atom(name), "the role") for name in wanted]
    while queue:
        atom, by = queue.pop(0)
        if installed.find(atom) is not None:
            continue
        name = offline.find(atom)
        if name is None:
            missing.append(Missing(str(atom), by))
            continue
        if name in seen:
            continue
        seen.add(name)
        to_install.append(name)
        fields = offline.stanzas[name]
        for key in ("Pre-Depends", "Depends"):
            for group in parse_depends(fields.get(key, "")):
                hit = next((a for a in group if installed.find(a) or offline.find(a)), None)
                if hit is None:
                    missing.append(Missing(" | ".join(str(a) for a in group), name))
                else:
                    queue.append((hit, name))
    return to_install, missing


# ---------------------------------------------------------------- .deb files


def _members(data: bytes, path: str) -> dict[str, bytes]:
    if not data.startswith(_AR_MAGIC):
        raise DebError(f"{path} is not a Debian package (no ar header)")
    out, i = {}, len(_AR_MAGIC)
    while i + 60 <= len(data):
        header = data[i : i + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        # ar's size is decimal digits, space-padded, and each header ends "`\n": anything else (a sign, a
        # negative size that would never move past this header) is a broken archive.
        field = header[48:58].strip()
        if not field.isdigit() or header[58:60] != b"`\n" or i + 60 + int(field) > len(data):
            raise DebError(f"{path}: a broken ar member header at byte {i}")
        size = int(field)
        out[name] = data[i + 60 : i + 60 + size]
        i += 60 + size + (size & 1)
    return out


def _decompress(name: str, blob: bytes, path: str) -> bytes:
    try:
        if name.endswith(".xz"):
            out = lzma.LZMADecompressor().decompress(blob, MAX_CONTROL + 1)
        elif name.endswith(".gz"):
            out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(blob, MAX_CONTROL + 1)
        elif name.endswith(".tar"):
            out = blob
        else:
            raise DebError(f"{path}: {name} is compressed in a way Python cannot read (zstd): read it with dpkg-deb")
    except (lzma.LZMAError, zlib.error) as exc:
        raise DebError(f"{path}: {name} does not decompress ({exc})") from exc
    if len(out) > MAX_CONTROL:
        raise DebError(f"{path}: {name} is over {MAX_CONTROL} bytes")
    return out


def control_fields(data: bytes, path: str) -> str:
    """A .deb's ``control`` file (its text), read from the bytes of the package."""
    members = _members(data, path)
    name = next((n for n in members if n.startswith("control.tar")), None)
    if name is None:
        raise DebError(f"{path} has no control.tar member")
    raw = _decompress(name, members[name], path)
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for info in tar:
                if info.name in ("./control", "control") and info.isreg() and info.size <= MAX_CONTROL:
                    f = tar.extractfile(info)
                    if f is not None:
                        return f.read().decode("utf-8", "replace")
    except tarfile.TarError as exc:
        raise DebError(f"{path}: control.tar is broken ({exc})") from exc
    raise DebError(f"{path} has no control file")


def read_regular(path: str, limit: int = MAX_DEB) -> bytes:
    """A package file's bytes: never through a link, never a FIFO or device, at most ``limit`` bytes."""
    try:
        return read_regular_file(path, limit, follow_links=False)
    except NotRegular:
        raise DebError(f"{path} is not a regular file") from None
    except TooLarge:
        raise DebError(f"{path} is over {limit} bytes") from None


def offline_index(directory: str, control: object = None) -> tuple[str, list[str]]:
    """The apt ``Packages`` index of a directory's .debs (control fields, Filename, Size, SHA256),
    and the problems found (a name that is not a package file's, a link, a FIFO, a package that does
    not read). ``control``: a fallback ``path -> control text`` for what Python cannot decompress."""
    problems, stanzas = [], []
    try:
        names = sorted(os.listdir(directory))[:MAX_FILES]
    except OSError as exc:
        return "", [f"cannot list the offline directory {directory} ({exc.strerror})"]
    for name in names:
        if not name.endswith(".deb"):
            continue
        path = os.path.join(directory, name)
        if not DEB_FILE.fullmatch(name) or not package_file_ok(name):
            problems.append(f"{path}: not a package file name (letters, digits, . + ~ _ % -, not starting with -)")
            continue
        try:
            data = read_regular(path)
            try:
                text = control_fields(data, path)
            except DebError:
                if control is None:
                    raise
                text = control(path)  # type: ignore[operator]
        except (DebError, OSError) as exc:
            problems.append(str(exc) if isinstance(exc, DebError) else f"{path}: {exc.strerror or exc}")
            continue
        fields = parse_stanzas(text)
        if not fields or not DEB_NAME.fullmatch(fields[0].get("Package", "")):
            problems.append(f"{path}: its control file names no valid package")
            continue
        lying = sorted(k for k in fields[0] if k in INDEX_FIELDS)
        if lying:
            problems.append(f"{path}: its control file carries the index's own fields ({', '.join(lying)})")
            continue
        body = text.strip("\n")
        if "\n\n" in body or any(c in body for c in "\r\0"):
            problems.append(f"{path}: its control file is not one stanza")
            continue
        digest = hashlib.sha256(data).hexdigest()
        stanzas.append(f"{body}\nFilename: ./{name}\nSize: {len(data)}\nSHA256: {digest}\n")
    return "\n".join(stanzas), problems
