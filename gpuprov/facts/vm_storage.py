"""What is on disk for one VM (its storage folder, base image, overlay, cloud-init
seed, boot files, GPU ROM files): read below a root
(a staged root holds the host's files), for :func:`gpuprov.plan.vm.plan.plan_vm`.

Reads only (the ROM files too: an lstat walk below the root). Standard library only (ships with the modules).
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.vm_spec import ROM_DIR
from .sysfs import Sysfs

if TYPE_CHECKING:
    from ..core.vm_spec import VmSpec


@dataclass
class StorageState:
    """What is on disk for one VM (read by the module, given to the planner)."""

    dir_exists: bool = True
    base_exists: bool = True
    overlay_exists: bool = False
    seed_files: dict[str, str | None] = field(default_factory=dict)  # path -> current text
    seed_iso_exists: bool = False
    seed_dir_exists: bool = False
    missing_boot_files: list[str] = field(default_factory=list)
    rom_problems: list[str] = field(default_factory=list)  # GPU ROM files that are not usable


def rom_problems(spec: VmSpec, root: str = "/") -> list[str]:
    """Why each ROM file the VM's GPUs name is not usable below ``root`` (:func:`rom_file_problem`)."""
    paths = [g.rom for g in spec.gpus if g.rom not in (None, "on", "off")]
    return [problem for path in paths if (problem := rom_file_problem(root, str(path)))]


def read_storage(spec: VmSpec, paths: dict[str, str | None], storage_dir: str, root: str = "/") -> StorageState:
    """What is on disk for the VM, read below ``root`` (a staged root holds the host's files)."""

    def below(path: str) -> str:
        return Sysfs(root).write_path(path.lstrip("/"))

    def text(path: str) -> str | None:
        try:
            with open(below(path), encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError):
            return None

    def exists(path: str | None) -> bool:
        return bool(path) and os.path.exists(below(path or ""))

    seed = {}
    if paths.get("seed_dir"):
        for name in ("user-data", "meta-data"):
            path = f"{paths['seed_dir']}/{name}"
            seed[path] = text(path)
    boot = [p for p in ([spec.boot.kernel, spec.boot.initrd] if spec.boot else []) if p and not exists(p)]
    return StorageState(
        dir_exists=os.path.isdir(below(storage_dir)),
        base_exists=exists(paths.get("base")),
        overlay_exists=exists(paths.get("disk")),
        seed_files=seed,
        seed_iso_exists=exists(paths.get("seed_iso")),
        seed_dir_exists=bool(paths.get("seed_dir")) and os.path.isdir(below(paths["seed_dir"] or "")),
        missing_boot_files=boot,
        rom_problems=rom_problems(spec, root),
    )


def rom_file_problem(root: str, path: str) -> str | None:
    """Why ``path`` (in :data:`ROM_DIR`) is not a usable ROM file below ``root``, or None.

    Resolved as if ``root`` were ``/``: a symlink may point elsewhere in the ROM
    directory, never out of it; the end must be a regular file.
    """
    top = _resolve(root, ROM_DIR)
    found = _resolve(root, path)
    if top is None or found is None:
        return f"ROM file {path} not found (or a symlink loop)"
    if not found.startswith(top + "/"):
        return f"ROM file {path} leads out of {ROM_DIR} (a symlink to {found})"
    try:
        mode = os.lstat(_below(root, found)).st_mode
    except OSError:
        return f"ROM file {path} not found"
    if not stat.S_ISREG(mode):
        return f"ROM file {path} is not a regular file"
    return None


def _below(root: str, path: str) -> str:
    return os.path.join(os.path.abspath(root), path.lstrip("/"))


def _resolve(root: str, path: str, hops: int = 40) -> str | None:
    """``path`` with every symlink followed as if ``root`` were ``/`` (None: missing or a loop)."""
    done = "/"
    todo = [c for c in path.split("/") if c not in ("", ".")]
    while todo:
        part = todo.pop(0)
        if part == "..":
            done = posixpath.dirname(done)
            continue
        candidate = posixpath.join(done, part)
        full = _below(root, candidate)
        try:
            st = os.lstat(full)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            hops -= 1
            if hops < 0:
                return None
            target = os.readlink(full)
            todo = [c for c in target.split("/") if c not in ("", ".")] + todo
            done = "/" if target.startswith("/") else done
            continue
        done = candidate
    return done


# ---------------------------------------------------------------- CPU lists
