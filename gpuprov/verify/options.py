"""What ``gpuprov verify``'s options allow, shared by the command line and the
gpu_verify Ansible module: the words are the CLI's; :func:`module_words` names the
module's options instead."""

from __future__ import annotations

from typing import Any

from ..facts.sysfs import Sysfs
from .gather import AUTO, import_optional


def option_error(live: bool, *, bench: bool, image: str | None, gpu_source: str) -> str | None:
    """Why these options cannot go together (``None`` when they can)."""
    if not live and bench:
        return "--bench measures this machine's GPU: it cannot run on a --root capture; drop one of them"
    if not live and image:
        return "--image runs a container on this machine: it cannot go with --root; drop one of them"
    if not live and gpu_source == "nvml":
        return "--gpu-source nvml asks this machine's driver: it cannot go with --root"
    return None


def module_words(text: str) -> str:
    """``text`` with the CLI's option names as the module's (``--gpu-source`` -> ``gpu_source``)."""
    return text.replace("--gpu-source", "gpu_source").replace("--root", "root").replace("--", "")


def nvml_for(gpu_source: str) -> Any:
    """What :func:`gpuprov.verify.gather.gather` takes as ``nvml``: ``"auto"``, or, for
    ``gpu_source`` nvml, the pynvml module (``None`` when it does not import)."""
    return import_optional("pynvml") if gpu_source == "nvml" else AUTO


def root_error(sysfs: Sysfs, root: str) -> str | None:
    """Why ``root`` cannot be read (``None`` when it can): it needs sys/ and proc/."""
    if not sysfs.exists("sys") or not sysfs.exists("proc"):
        return f"root {root} has no sys/ and proc/: give the top of an unpacked capture or a staged root"
    return None
