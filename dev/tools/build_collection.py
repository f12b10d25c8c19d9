#!/usr/bin/env python3
"""Assemble the Ansible collection gpuprov.kvm from this repository; optionally build its tarball.

The repository is the one source. This script copies (never links: links trip
``ansible-test sanity``) into ``build/collections/ansible_collections/gpuprov/kvm/``:

- ``collection/`` (galaxy.yml, with the version of ``gpuprov/__init__.py`` written in;
  meta/; tests/config.yml; README.md, the collection's own), and LICENSE;
- ``tests/sanity/ignore-X.Y.txt``, written (:func:`sanity_ignores`) for each ansible-core
  release from meta/runtime.yml's ``requires_ansible`` to pyproject's pin: the one ignore,
  ``validate-modules:missing-gplv3-license``, for every module and plugin;
- ``docs/``: the pages the collection's README links, and the pages and files they link, on
  to the end (:func:`carried_docs`), so that every relative link of the installed collection
  resolves; a link to a repository file the collection does not hold (a JSON schema of the
  command line, a test fixture) becomes a link to that file in the repository (galaxy.yml's
  ``repository``);
- ``plugins/modules``, ``plugins/lookup``, ``plugins/callback`` and ``plugins/doc_fragments``;
- ``plugins/module_utils/gpuprov``: the part of the ``gpuprov`` package the modules
  import, found by following their imports (:data:`CLI_ONLY` stops the walk);
- ``roles/`` and ``playbooks/``;
- ``changelogs/`` (antsibull-changelog's config, changelog.yaml and the fragments not yet
  released) and ``CHANGELOG.md``, which ``--changelog-release`` writes (:func:`changelog`);
- ``roles/vgpu_host/files/gpuprov-vgpu.pyz``: a zipapp of that module_utils package whose
  ``__main__`` runs the vGPU boot entry point (gpuprov.apply.vgpu); the role installs it as
  ``/usr/lib/gpuprov/gpuprov-vgpu.pyz`` for ``gpuprov-vgpu.service``. Deterministic: sorted
  entries, fixed timestamps and modes, so an unchanged checkout builds the same bytes; its
  sha256 beside it (``.sha256``), which the role compares with the installed one's.

That tree is also the developers' collection (``ansible.cfg``: ``collections_path =
./build/collections``). A run whose inputs hash as the last one's changes nothing,
so every entry point can call it first (docs/collection.md). ``--tarball`` also runs ``ansible-galaxy
collection build`` and prints the tarball's path. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import hashlib
import io
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
import zipapp
import zipfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAMESPACE, NAME = "gpuprov", "kvm"
BUILD = REPO / "build"
COLLECTIONS = BUILD / "collections"
TREE = COLLECTIONS / "ansible_collections" / NAMESPACE / NAME
STAMP = COLLECTIONS / f".{NAMESPACE}.{NAME}.inputs"
# How a module imports the package: the collection form, also in the checkout.
UTILS_PACKAGE = f"ansible_collections.{NAMESPACE}.{NAME}.plugins.module_utils.gpuprov"

# The gpuprov modules that are the command line's, not the modules': the import walk
# stops at them. Module-side code may name them only inside a function that the
# modules never call (verify.py's CLI entry imports .cli); at module level that is an
# error, as is any import at module level outside the standard library and Ansible.
CLI_ONLY = frozenset({"__main__", "cli"})

# Copied whole, below the repo root -> below the collection root.
TREES = {
    "plugins/modules": "plugins/modules",
    "plugins/doc_fragments": "plugins/doc_fragments",
    "plugins/lookup": "plugins/lookup",
    "plugins/callback": "plugins/callback",
    "roles": "roles",
    "playbooks": "playbooks",
    "collection/meta": "meta",
    "collection/tests": "tests",
    "changelogs": "changelogs",
}
FILES = {"collection/README.md": "README.md", "LICENSE": "LICENSE", "CHANGELOG.md": "CHANGELOG.md"}
# What antsibull-changelog keeps of a run (changelog): the release data and its rendering.
CHANGELOG_OUTPUTS = ("changelogs/changelog.yaml", "CHANGELOG.md")
# The repository's docs the collection carries, from the pages its README links (carried_docs).
DOCS = "docs"
# Markdown links, as tests/house/test_docs_links.py finds them: inline (and images) and reference
# definitions, outside code; group "target" is the link target.
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
_LINK = re.compile(
    r"!?\[[^\]]*\]\(\s*<?(?P<inline>[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
    r"|^\s*\[[^\]]+\]:\s*<?(?P<ref>\S+?)>?(?:\s+.*)?$",
    re.M,
)
_URL = re.compile(r"^([a-z][a-z0-9+.-]*:|#)", re.I)
# The boot unit's runner, built from the module_utils package (docs/collection.md).
BOOT_PYZ = "roles/vgpu_host/files/gpuprov-vgpu.pyz"
BOOT_PYZ_SHA256 = BOOT_PYZ + ".sha256"
BOOT_MAIN = '''"""gpuprov-vgpu.pyz: re-apply the saved vGPU layout at boot (gpuprov-vgpu.service runs it)."""

from gpuprov.apply.vgpu import main

raise SystemExit(main())
'''
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can say: the same bytes on every build
SKIP_NAMES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".molecule"}


class BuildError(Exception):
    """The collection cannot be assembled; the message names the file and the fix."""


def version() -> str:
    text = (REPO / "gpuprov" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    if not match:
        raise BuildError('gpuprov/__init__.py has no line __version__ = "X.Y.Z"')
    return match.group(1)


def walk(top: Path) -> Iterator[Path]:
    """Every file below ``top``, sorted, without caches; a link is an error (sanity rejects them)."""
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_NAMES)
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if name.endswith(".pyc"):
                continue
            if path.is_symlink():
                raise BuildError(f"{path.relative_to(REPO)} is a symlink: collections hold plain files; copy it")
            yield path


def _module_file(parts: list[str]) -> Path | None:
    """The file of gpuprov module ``parts`` (relative to the package), or None when it is no module."""
    base = REPO.joinpath("gpuprov", *parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _is_stdlib_or_ansible(name: str) -> bool:
    top = name.split(".")[0]
    return top in sys.stdlib_module_names or top == "ansible" or name.startswith(UTILS_PACKAGE)


def _imports(path: Path, parts: list[str]) -> Iterator[tuple[list[str], bool, int]]:
    """(gpuprov module imported, at module level?, line) for every import of package modules in ``path``.

    ``parts`` is ``path``'s module, relative to the package (``[]`` for modules outside it).
    Raises BuildError for a module-level import from outside the standard library and Ansible."""
    tree = ast.parse(path.read_text(), str(path))
    top_level = {id(node) for node in tree.body}
    is_pkg = path.name == "__init__.py"
    here = parts if is_pkg else parts[:-1]
    for node in ast.walk(tree):
        module_level = id(node) in top_level
        if isinstance(node, ast.Import):
            for alias in node.names:
                if module_level and not _is_stdlib_or_ansible(alias.name):
                    raise BuildError(f"{path.relative_to(REPO)}:{node.lineno}: imports {alias.name} at module level")
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 0:
            name = node.module or ""
            if name == UTILS_PACKAGE or name.startswith(UTILS_PACKAGE + "."):
                base = name[len(UTILS_PACKAGE) :].lstrip(".").split(".") if name != UTILS_PACKAGE else []
                base = [p for p in base if p]
            elif module_level and not _is_stdlib_or_ansible(name):
                raise BuildError(f"{path.relative_to(REPO)}:{node.lineno}: imports {name} at module level")
            else:
                continue
        else:
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else list(here)
            base = base + (node.module.split(".") if node.module else [])
        yield base, module_level, node.lineno
        # `from . import x`: x is a module of its own when it has a file
        for alias in node.names:
            if _module_file([*base, alias.name]) is not None:
                yield [*base, alias.name], module_level, node.lineno


def module_utils_closure() -> list[Path]:
    """The gpuprov files the modules import, directly or not, with their packages' __init__.py."""
    todo: list[tuple[Path, list[str]]] = [
        (p, []) for kind in ("modules", "lookup") for p in walk(REPO / "plugins" / kind) if p.suffix == ".py"
    ]
    seen: dict[Path, list[str]] = {}
    while todo:
        path, parts = todo.pop()
        for target, module_level, line in _imports(path, parts):
            if target and target[0] in CLI_ONLY:
                if module_level:
                    raise BuildError(
                        f"{path.relative_to(REPO)}:{line}: imports gpuprov.{'.'.join(target)} (command line only) "
                        "at module level; import it inside the function that needs it"
                    )
                continue
            for depth in range(len(target) + 1):  # the packages on the way, then the module
                prefix = target[:depth]
                found = _module_file(prefix)
                if found is None:
                    if depth == len(target):
                        raise BuildError(f"{path.relative_to(REPO)}:{line}: no module gpuprov.{'.'.join(target)}")
                    continue
                if found not in seen:
                    seen[found] = prefix
                    todo.append((found, prefix))
    return sorted(seen)


def plan_copies() -> dict[str, Path]:
    """Collection-relative path -> repo file, for everything but galaxy.yml."""
    copies: dict[str, Path] = {}
    for src, dest in TREES.items():
        if not (REPO / src).is_dir():
            raise BuildError(f"{src}/ is missing")
        for path in walk(REPO / src):
            copies[f"{dest}/{path.relative_to(REPO / src).as_posix()}"] = path
    for src, dest in FILES.items():
        if src == "CHANGELOG.md" and not (REPO / src).is_file():
            continue  # antsibull-changelog writes it at the first release
        copies[dest] = REPO / src
    for path in module_utils_closure():
        copies[f"plugins/module_utils/{path.relative_to(REPO).as_posix()}"] = path
    return copies


def _markdown_links(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, target) of each relative link target in ``text``: no URLs, mail or in-page anchors."""
    masked = _FENCE.sub(lambda m: " " * len(m[0]), text)
    masked = _CODE_SPAN.sub(lambda m: " " * len(m[0]), masked)  # same length: positions stay
    for match in _LINK.finditer(masked):
        group = "inline" if match["inline"] is not None else "ref"
        target = match[group]
        if not _URL.match(target):
            yield match.start(group), match.end(group), target


def repository_url() -> str:
    match = re.search(r"^repository:\s*(\S+)\s*$", (REPO / "collection" / "galaxy.yml").read_text(), re.M)
    if not match:
        raise BuildError("collection/galaxy.yml has no repository: URL")
    return match[1].rstrip("/")


def carried_docs(copies: dict[str, Path]) -> dict[str, bytes]:
    """Collection path -> content of each file of ``docs/`` the collection carries.

    From the collection's README (``copies["README.md"]``), every relative link is followed
    into ``docs/`` (paths in the collection are the repository's there), Markdown pages on
    to their own links. A link may also name a file the collection holds anyway
    (``LICENSE``, a role's file); a link to any other repository file is rewritten to that
    file in the repository (``REPOSITORY/blob/main/PATH``); one that leaves the repository or
    names nothing is a BuildError."""
    base = repository_url()
    docs: dict[str, bytes] = {}
    todo = ["README.md"]
    while todo:
        dest = todo.pop()
        src = copies[dest] if dest == "README.md" else REPO / dest
        text = src.read_text(encoding="utf-8")
        out, last = [], 0
        for start, end, target in _markdown_links(text):
            path, _, anchor = target.partition("#")
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(dest), path))
            if resolved.startswith("../") or resolved == "..":
                raise BuildError(f"{src.relative_to(REPO)}: link {target} leaves the repository")
            if resolved in copies or resolved in docs:
                continue
            if resolved.split("/")[0] == DOCS and (REPO / resolved).is_file():
                docs[resolved] = (REPO / resolved).read_bytes()
                if resolved.endswith(".md"):
                    todo.append(resolved)
                continue
            if not (REPO / resolved).exists():
                raise BuildError(f"{src.relative_to(REPO)}: link {target}: no {resolved} in the repository")
            out += [text[last:start], f"{base}/blob/main/{resolved}" + (f"#{anchor}" if anchor else "")]
            last = end
        if dest != "README.md":
            docs[dest] = ("".join(out) + text[last:]).encode()
        elif out:
            raise BuildError(f"{src.relative_to(REPO)} links {out[1]}: link a page of docs/ or an absolute URL")
    return docs


GPL_IGNORE = (
    "validate-modules:missing-gplv3-license # the collection is Apache-2.0 (LICENSE): the check is for "
    "ansible-core's own GPLv3 modules (ansible/ansible#67032)"
)


def sanity_releases() -> list[str]:
    """The ansible-core releases (X.Y) the collection admits and is tested with: from
    meta/runtime.yml's ``requires_ansible: ">=X.Y.0"`` to pyproject's ansible-core pin (``<X.Z``)."""
    runtime = (REPO / "collection" / "meta" / "runtime.yml").read_text()
    low = re.search(r'^requires_ansible:\s*"?>=\s*(\d+)\.(\d+)', runtime, re.M)
    high = re.search(r'"ansible-core[^"]*<\s*(\d+)\.(\d+)', (REPO / "pyproject.toml").read_text())
    if not low or not high or low[1] != high[1] or int(low[2]) >= int(high[2]):
        raise BuildError("no ansible-core releases between meta/runtime.yml's requires_ansible and pyproject's pin")
    return [f"{low[1]}.{minor}" for minor in range(int(low[2]), int(high[2]))]


def sanity_ignores(copies: dict[str, Path]) -> dict[str, bytes]:
    """tests/sanity/ignore-X.Y.txt for each of :func:`sanity_releases`: the GPLv3 header check off
    for every module and plugin (the collection is Apache-2.0)."""
    plugins = sorted(
        dest
        for dest in copies
        if dest.endswith(".py")
        and dest.split("/")[:2] in (["plugins", "modules"], ["plugins", "lookup"], ["plugins", "callback"])
    )
    text = "".join(f"{path} {GPL_IGNORE}\n" for path in plugins if not path.endswith("/__init__.py")).encode()
    return {f"tests/sanity/ignore-{release}.txt": text for release in sanity_releases()}


def boot_pyz(copies: dict[str, Path]) -> bytes:
    """The zipapp of the module_utils ``gpuprov`` package, its ``__main__`` the vGPU boot entry point."""
    prefix = "plugins/module_utils/"
    entries = {dest[len(prefix) :]: src.read_bytes() for dest, src in copies.items() if dest.startswith(prefix)}
    if "gpuprov/apply/vgpu.py" not in entries:
        raise BuildError("no module imports gpuprov.apply.vgpu: the boot zipapp has no entry point")
    entries["__main__.py"] = BOOT_MAIN.encode()
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o100644 << 16
            archive.writestr(info, entries[name])
    raw.seek(0)
    out = io.BytesIO()
    zipapp.create_archive(raw, out, interpreter="/usr/bin/python3")
    return out.getvalue()


def galaxy_yml() -> str:
    text = (REPO / "collection" / "galaxy.yml").read_text()
    if re.search(r"^version:", text, re.MULTILINE):
        raise BuildError("collection/galaxy.yml sets version: drop it; the version is gpuprov/__init__.py's")
    return text.rstrip("\n") + f"\nversion: {version()}\n"


def inputs_digest(copies: dict[str, Path], galaxy: str, generated: dict[str, bytes]) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(galaxy.encode())
    for dest, content in sorted(generated.items()):
        digest.update(f"\0{dest}\0".encode())
        digest.update(content)
    for dest, src in sorted(copies.items()):
        digest.update(f"\0{dest}\0{os.stat(src).st_mode & 0o111:o}\0".encode())
        digest.update(src.read_bytes())
    return digest.hexdigest()


def assemble() -> bool:
    """Make TREE match the repository; False when it already did (nothing written)."""
    COLLECTIONS.mkdir(parents=True, exist_ok=True)
    with open(COLLECTIONS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the test session and a script may build at once
        copies = plan_copies()
        galaxy = galaxy_yml()
        generated = carried_docs(copies) | sanity_ignores(copies)
        digest = inputs_digest(copies, galaxy, generated)
        if TREE.is_dir() and STAMP.is_file() and STAMP.read_text().strip() == digest:
            return False
        TREE.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{NAME}.", dir=TREE.parent))
        for dest, src in copies.items():
            target = staging / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
        (staging / "galaxy.yml").write_text(galaxy)
        for dest, content in generated.items():
            (staging / dest).parent.mkdir(parents=True, exist_ok=True)
            (staging / dest).write_bytes(content)
        (staging / BOOT_PYZ).parent.mkdir(parents=True, exist_ok=True)
        pyz = boot_pyz(copies)
        (staging / BOOT_PYZ).write_bytes(pyz)
        # The role compares it with the installed runner's (module gpu_vgpu's runner_sha256) and
        # copies the zipapp only when they differ: no copy module run on a converged host.
        (staging / BOOT_PYZ_SHA256).write_text(hashlib.sha256(pyz).hexdigest() + "\n")
        if TREE.exists():
            old = TREE.with_name(f".{NAME}.old")
            shutil.rmtree(old, ignore_errors=True)
            TREE.rename(old)
            staging.rename(TREE)
            shutil.rmtree(old)
        else:
            staging.rename(TREE)
        STAMP.write_text(digest + "\n")
        return True


def tarball(output: Path) -> Path:
    """``ansible-galaxy collection build`` of TREE into ``output``; the tarball's path."""
    galaxy = shutil.which("ansible-galaxy", path=str(Path(sys.executable).parent)) or shutil.which("ansible-galaxy")
    if galaxy is None:
        raise BuildError("ansible-galaxy not found: install the ansible extra (scripts/bootstrap.sh ansible)")
    output.mkdir(parents=True, exist_ok=True)
    cmd = [galaxy, "collection", "build", str(TREE), "--output-path", str(output), "--force"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    if proc.returncode != 0:
        raise BuildError(f"ansible-galaxy collection build failed:\n{proc.stdout}{proc.stderr}")
    path = output / f"{NAMESPACE}-{NAME}-{version()}.tar.gz"
    if not path.is_file():
        raise BuildError(f"ansible-galaxy built no {path.name}:\n{proc.stdout}")
    return path


def changelog(args: list[str], write: bool = False) -> dict[str, str]:
    """``antsibull-changelog ARGS`` in a copy of the assembled collection (it reads galaxy.yml,
    the plugins' docs and changelogs/ there); CHANGELOG_OUTPUTS and the fragments left, as it
    leaves them (path -> text). With ``write``, the repository gets them: those files written,
    the fragments it folded into a release removed."""
    tool = shutil.which("antsibull-changelog", path=str(Path(sys.executable).parent)) or shutil.which(
        "antsibull-changelog"
    )
    if tool is None:
        raise BuildError("antsibull-changelog not found: pip install antsibull-changelog (pyproject's test extra)")
    fragments = "changelogs/fragments/"
    assemble()
    with tempfile.TemporaryDirectory(prefix="gpuprov-changelog.") as top:
        copy = Path(top, "ansible_collections", NAMESPACE, NAME)
        shutil.copytree(TREE, copy)
        proc = subprocess.run([tool, *args], cwd=copy, capture_output=True, text=True, check=False, timeout=600)
        if proc.returncode != 0:
            raise BuildError(f"antsibull-changelog {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
        result = {name: (copy / name).read_text() for name in CHANGELOG_OUTPUTS}
        result |= {fragments + p.name: p.read_text() for p in sorted((copy / fragments).glob("*"))}
    if write:
        for name in CHANGELOG_OUTPUTS:
            (REPO / name).write_text(result[name])
        for path in sorted((REPO / fragments).glob("*")):
            if fragments + path.name not in result:
                path.unlink()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tarball", action="store_true", help="also build the collection tarball")
    parser.add_argument("--output", type=Path, default=BUILD, help="where the tarball goes (default: build/)")
    parser.add_argument("--quiet", action="store_true", help="print only the tarball's path")
    parser.add_argument(
        "--changelog-release",
        metavar="DATE",
        nargs="?",
        const="",
        help="release gpuprov/__init__.py's version in changelogs/changelog.yaml and CHANGELOG.md from the "
        "fragments (antsibull-changelog release [--date DATE]), and remove those fragments",
    )
    args = parser.parse_args(argv)
    try:
        if args.changelog_release is not None:
            changelog(["release", *(["--date", args.changelog_release] if args.changelog_release else [])], True)
            print(f"changelogs/changelog.yaml, CHANGELOG.md: {version()} released", file=sys.stderr)
            return 0
        changed = assemble()
        if not args.quiet:
            print(f"{TREE.relative_to(REPO)}: {'assembled' if changed else 'up to date'}", file=sys.stderr)
        if args.tarball:
            print(tarball(args.output))
    except (BuildError, OSError, SyntaxError) as exc:
        print(f"build_collection: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
