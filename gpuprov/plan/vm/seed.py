"""cloud-init NoCloud seed for a guest: the files, and the command that makes the ISO.

The seed is a small ISO 9660 image labelled ``cidata`` holding ``user-data``
and ``meta-data``; cloud-init's NoCloud datasource finds it on the guest's
CD-ROM. ``instance-id`` carries a hash of the user-data, so a changed seed (a
new SSH key) is applied again at the next boot. The network is left to
cloud-init's fallback: DHCP on the first NIC.

Pure and standard library only (user-data is JSON, which is YAML).
"""

from __future__ import annotations

import hashlib
import json

from ...core.vm_spec import CloudInitSpec

# The ISO tools this knows, in the order they are looked for on the host.
ISO_TOOLS = ("genisoimage", "xorriso", "mkisofs", "cloud-localds")


def user_data(spec: CloudInitSpec, hostname: str) -> str:
    user = {
        "name": spec.user,
        "shell": "/bin/bash",
        "groups": ["sudo"],
        "sudo": "ALL=(ALL) NOPASSWD:ALL",
        "lock_passwd": True,
        "ssh_authorized_keys": list(spec.ssh_authorized_keys),
    }
    config: dict[str, object] = {
        "hostname": spec.hostname or hostname,
        "manage_etc_hosts": True,
        "users": [user],
        "ssh_pwauth": False,
        "disable_root": True,
    }
    if spec.packages:
        config["packages"] = list(spec.packages)
    return "#cloud-config\n" + json.dumps(config, indent=2, sort_keys=True) + "\n"


def meta_data(name: str, user_data_text: str, hostname: str) -> str:
    digest = hashlib.sha256(user_data_text.encode()).hexdigest()[:12]
    return f"instance-id: {name}-{digest}\nlocal-hostname: {hostname}\n"


def seed_files(spec: CloudInitSpec, name: str) -> dict[str, str]:
    """File name -> content of the seed."""
    hostname = spec.hostname or name
    ud = user_data(spec, hostname)
    return {"user-data": ud, "meta-data": meta_data(name, ud, hostname)}


def iso_command(tool: str, iso: str, files: dict[str, str]) -> list[str]:
    """argv that writes ``iso`` (label cidata) from ``files`` (name in the ISO -> path on the host)."""
    name = tool.rsplit("/", 1)[-1]
    if name == "cloud-localds":
        argv = [tool, iso, files["user-data"], files["meta-data"]]
        if "network-config" in files:
            argv += ["--network-config", files["network-config"]]
        return argv
    prefix = [tool, "-as", "mkisofs"] if name == "xorriso" else [tool]
    grafts = [f"{n}={p}" for n, p in sorted(files.items())]
    return [*prefix, "-quiet", "-output", iso, "-volid", "cidata", "-joliet", "-rock", "-graft-points", *grafts]
