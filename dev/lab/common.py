"""The lab's shared pieces: where it lives (cache dir, SSH port), the -e overrides inventories/lab
needs elsewhere, host tools, its SSH key."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from . import debpkg

HOSTNAME = "lab-gpu-host"
DEFAULT_PORT = 2522
PORT_ENV = "GPUPROV_LAB_PORT"
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
BOOT_TIMEOUT = 900  # seconds for SSH to answer after QEMU starts (TCG on 2 cores: about 1 minute)


class LabError(RuntimeError):
    """Something the user can act on; the message names the fix."""


def lab_dir() -> Path:
    base = os.environ.get("GPUPROV_CACHE") or str(Path.home() / ".cache" / "gpuprov")
    return Path(base) / "lab"


def default_port() -> int:
    return int(os.environ.get(PORT_ENV) or DEFAULT_PORT)


def inventory_overrides(lab: Path, port: int) -> dict[str, object] | None:
    """The variables inventories/lab needs when the lab is not where it assumes (None when it is),
    for ``ansible-playbook -e JSON``."""
    if lab == Path.home() / ".cache/gpuprov/lab" and port == DEFAULT_PORT:
        return None
    return {
        "ansible_port": port,
        "ansible_ssh_private_key_file": f"{lab}/id_ed25519",
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={lab}/known_hosts -o IdentitiesOnly=yes",
    }


def overrides_option(extra: dict[str, object]) -> str:
    """``-e '{...}'`` for a shell."""
    return "-e " + shlex.quote(json.dumps(extra))


def say(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


# Host tools: the command (or file) and the Debian package that has it.
BUILD_TOOLS = {
    "debootstrap": "debootstrap",
    "mkfs.ext4": "e2fsprogs",
    "mkfs.vfat": "dosfstools",
    "mcopy": "mtools",
    "sgdisk": "gdisk",  # systemd-boot's GPT ESP
    "ssh-keygen": "openssh-client",
    "make": "make",
    "gcc-12": "gcc-12",
    "xz": "xz-utils",
}
RUN_TOOLS = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-img": "qemu-utils",
    "ssh": "openssh-client",
    str(OVMF_CODE): "ovmf",
}


def ensure_tools(tools: dict[str, str]) -> None:
    """Install the Debian packages of missing tools (as root), or say which are missing."""
    missing = sorted({pkg for tool, pkg in tools.items() if not (shutil.which(tool) or Path(tool).is_file())})
    if not missing:
        return
    if os.geteuid() != 0:
        raise LabError(f"missing tools: apt-get install {' '.join(missing)} (as root)")
    say(f"installing {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Another apt beside it (scripts/test.sh's other lane, a developer's): wait for dpkg's lock.
    install = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", "--no-install-recommends"]
    r = subprocess.run([*install, *missing], env=env, check=False)
    if r.returncode:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False)
        debpkg.sh([*install, *missing], env=env)


def ensure_key(lab: Path) -> Path:
    """The lab's SSH key (root's authorized key in the image), made once per cache dir."""
    key = lab / "id_ed25519"
    if not key.exists():
        lab.mkdir(parents=True, exist_ok=True)
        ensure_tools({"ssh-keygen": "openssh-client"})
        debpkg.sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuprov-lab", "-f", str(key)])
    return key
