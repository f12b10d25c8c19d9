"""What the lab host is doing (status, --json for scripts/main.sh) and a command on it (ssh)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from . import debpkg
from .boot import qemu_pid, read_state, run_dir, ssh_argv
from .common import LabError, default_port, inventory_overrides, overrides_option
from .image import DEFAULT_LOADER, image_key


def status(lab: Path, as_json: bool) -> int:
    state = read_state(lab)
    pid = qemu_pid(lab)
    loader = state.get("loader", DEFAULT_LOADER) if pid else DEFAULT_LOADER
    try:
        key = image_key(lab, loader)[0]
    except debpkg.CommandError as exc:
        key = f"unknown ({str(exc).splitlines()[0]})"
    out = {
        "running": pid is not None,
        "loader": loader,
        "pid": pid,
        "ssh_port": state.get("port") if pid else None,
        "image_key": key,
        "image_cached": (lab / "images" / key / "info.json").exists(),
        "running_image_key": state.get("key") if pid else None,
        "lab_dir": str(lab),
        "console": str(run_dir(lab) / "console.log"),
        "ssh_key": str(lab / "id_ed25519"),
        # What `ansible-playbook -i inventories/lab` needs as -e (JSON) here; null: nothing.
        "inventory_overrides": inventory_overrides(lab, (state.get("port") if pid else None) or default_port()),
    }
    try:
        out["watchdog_resets"] = (run_dir(lab) / "watchdog.log").read_text().splitlines()
    except OSError:
        out["watchdog_resets"] = []
    if as_json:
        print(json.dumps(out, indent=2))
        return 0
    if pid:
        print(f"running: pid {pid}, {loader}, SSH on 127.0.0.1:{out['ssh_port']} (python -m dev.lab ssh)")
        if state.get("key") != key:
            print(f"  runs image {state.get('key')}; the inputs now give {key} (`down` and `up` to rebuild)")
    else:
        print("not running (python -m dev.lab up)")
    for line in out["watchdog_resets"]:
        print(f"  watchdog: {line}")
    print(f"image key: {key} ({'cached' if out['image_cached'] else 'not built yet'})")
    print(f"lab dir: {lab}")
    extra = out["inventory_overrides"]
    if extra:
        print(f"ansible-playbook -i inventories/lab needs: {overrides_option(extra)}")
    return 0


def ssh(lab: Path, command: list[str]) -> int:
    if qemu_pid(lab) is None:
        raise LabError("the lab host is not running: python -m dev.lab up")
    port = read_state(lab).get("port", default_port())
    if command and command[0] == "--":
        command = command[1:]
    argv = ssh_argv(lab, port, tty=not command and sys.stdin.isatty())
    return subprocess.run([*argv, *command], check=False).returncode
