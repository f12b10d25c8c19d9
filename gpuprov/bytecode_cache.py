"""A bytecode cache for the gpuprov code Ansible ships to a target (docs/development/bytecode-cache.md).

AnsiballZ ships ``module_utils`` as sources in a zip, and zipimport compiles every file again
on every module run: it never writes bytecode. A gpuprov module imports 13-50 of them, and
compiling them is most of what a no-op run costs on a slow host (2-2.5 s of an 8 s run on the
lab). When the package is imported from a zip (an AnsiballZ payload, the boot zipapp), the
package's ``__init__`` puts :class:`Finder` first on ``sys.meta_path``: each of its modules is
compiled once per source and Python, and later runs load the compiled code.

What is read is trusted only as far as the directory is: it, every directory above it (but a
sticky one of root's, such as /tmp) and each file must be owned by root or the effective user
and writable by no one else, opened without following links; an entry is used only when it was
made from the very source being imported (its sha256 in the header) by this Python (its magic
number). Anything else, and any error, falls back to compiling, as zipimport would: the cache
never changes what runs.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys
import zipimport
from contextlib import suppress
from importlib.machinery import ModuleSpec
from importlib.util import MAGIC_NUMBER
from types import CodeType, ModuleType
from typing import Any

DEFAULT_DIR = "/var/cache/gpuprov/bytecode"
# The largest entry read (gpuprov's biggest module compiles to about 100 KiB).
MAX_ENTRY = 8 * 1024 * 1024

try:  # what SourceLoader uses: tracebacks name this run's file, not the run that cached it
    from _imp import _fix_co_filename as fix_co_filename
except ImportError:  # pragma: no cover - CPython has it

    def fix_co_filename(code: CodeType, path: str) -> None:
        return None


def trusted(st: os.stat_result, kind: int) -> bool:
    """Of ``kind`` (stat.S_IFDIR or S_IFREG), owned by root or us, writable by no one else."""
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def usable_dir(directory: str) -> bool:
    """Create ``directory`` (0700) when missing; True when it is :func:`trusted` and so is every
    directory above it, or is root's and sticky (/tmp: no one else can move what is below it).
    No link on the way: each is lstat'ed."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.abspath(directory)
        if not trusted(os.lstat(path), stat.S_IFDIR):
            return False
        while (parent := os.path.dirname(path)) != path:
            st = os.lstat(parent)
            sticky = stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and st.st_mode & stat.S_ISVTX
            if not (trusted(st, stat.S_IFDIR) or sticky):
                return False
            path = parent
        return True
    except OSError:
        return False


def read_entry(entry: str, header: bytes) -> CodeType | None:
    """The code cached in ``entry`` when it starts with ``header``; None for anything else."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not trusted(st, stat.S_IFREG) or st.st_size > MAX_ENTRY:
            return None
        data = f.read(MAX_ENTRY + 1)
    if not data.startswith(header):
        return None
    try:
        code = marshal.loads(memoryview(data)[len(header) :])
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def write_entry(directory: str, entry: str, header: bytes, code: CodeType) -> None:
    """Write beside and rename (a reader sees an old entry or a whole new one); errors ignored."""
    import tempfile  # here: only a zip's first run writes, and inspect starts faster without it

    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header + marshal.dumps(code))
        os.replace(tmp, entry)
    except OSError:
        with suppress(OSError):
            os.unlink(tmp)


class Loader:
    """Loads one module of a zip as zipimport would, with its compiled code kept in the cache."""

    def __init__(self, zip_loader: zipimport.zipimporter, origin: str, source: bytes, directory: str) -> None:
        self.zip_loader = zip_loader
        self.origin = origin
        self.source = source  # read once, by the finder
        self.directory = directory

    def __getattr__(self, name: str) -> Any:  # get_data, get_resource_reader, is_package...
        return getattr(self.zip_loader, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(self.get_code(module.__name__), module.__dict__)

    def get_filename(self, fullname: str) -> str:
        return self.origin

    def get_code(self, fullname: str) -> CodeType:
        import hashlib  # here: only a zip's modules are hashed, and inspect starts faster without it

        header = MAGIC_NUMBER + hashlib.sha256(self.source).digest()
        entry = os.path.join(self.directory, f"{fullname}.{MAGIC_NUMBER.hex()}.pyc")
        code = read_entry(entry, header)
        if code is None:
            code = compile(self.source, self.origin, "exec", dont_inherit=True)
            write_entry(self.directory, entry, header, code)
        else:
            fix_co_filename(code, self.origin)
        return code


class Finder:
    """Finds the modules below ``package`` that are sources in a zip on the parent's path.

    Not through zipimport's own find_spec: on Python 3.11 it compiles the module to learn its
    file name, and then compiles it again to run it."""

    def __init__(self, package: str, directory: str) -> None:
        self.prefix = package + "."
        self.directory = directory

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if path is None or not fullname.startswith(self.prefix):
            return None
        name = fullname.rpartition(".")[2]
        for location in path:
            try:
                importer = zipimport.zipimporter(location)
                is_package = importer.is_package(fullname)
            except (zipimport.ZipImportError, OSError, TypeError):
                continue
            inside = f"{importer.archive}{os.sep}{importer.prefix}{name}"
            origin = f"{inside}{os.sep}__init__.py" if is_package else f"{inside}.py"
            try:
                source = importer.get_data(origin)  # a source (not a .pyc): ours to compile and cache
            except OSError:
                return None
            loader = Loader(importer, origin, source, self.directory)
            spec = ModuleSpec(fullname, loader, origin=origin, is_package=is_package)
            if is_package:
                spec.submodule_search_locations = [inside]
            spec.has_location = True
            return spec
        return None


def install(package: str, loader: object, directory: str = DEFAULT_DIR) -> bool:
    """Cache the bytecode of ``package``'s modules when ``loader`` (the package's own) is
    zipimport's and ``directory`` is usable; True when the cache is on. Once per package."""
    if not isinstance(loader, zipimport.zipimporter) or not usable_dir(directory):
        return False
    if not any(isinstance(f, Finder) and f.prefix == package + "." for f in sys.meta_path):
        sys.meta_path.insert(0, Finder(package, directory))
    return True
