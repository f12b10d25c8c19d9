"""Hostile inventories (issue #49, causes 4 and 7): ``plan -i``, ``init -i`` and ``gpuprov fleet`` end by
themselves on a FIFO, a link loop or an alias bomb in group_vars (refused before Ansible reads, naming the
file), and a dry run runs nothing the inventory says: ``lookup('pipe')`` and ``lookup('file')`` are
refused naming the variable, an inventory script is not run, unless ``--trust-inventory``. Each refusal
changes nothing (the tree is hashed before and after)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuprov.cli import inventory as cli_inventory
from gpuprov.cli.main import main

REPO = Path(__file__).resolve().parents[2]
H100 = REPO / "tests" / "fixtures" / "hosts" / "h100-live.tar.gz"
GOOD_HOST = "gpuprov_host:\n  version: 1\n  gpus:\n    - {name: gpu, address: '0000:00:06.0', use: host}\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(9)
)  # 10^10 values once expanded, in 700 bytes


def tree_hash(root: Path) -> str:
    """Every path below ``root``, its kind and a regular file's bytes (a FIFO is named, never opened)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = os.path.join(dirpath, name)
            h.update(path.encode())
            info = os.lstat(path)
            h.update(str(info.st_mode).encode())
            if os.path.isfile(path) and not os.path.islink(path):
                h.update(Path(path).read_bytes())
    return h.hexdigest()


def inventory(tmp_path: Path, host_vars: str = GOOD_HOST) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    node1: {}\n")
    (inv / "host_vars" / "node1.yml").write_text(host_vars)
    return inv


def run(capsys: pytest.CaptureFixture[str], verb: str, inv: Path, *extra: str) -> tuple[int, str]:
    args = ["plan", "--root", str(H100)] if verb == "plan" else ["init", "--root", str(H100)]
    code = main([*args, "-i", str(inv / "hosts.yml"), "--host", "node1", *extra])
    return code, capsys.readouterr().err


def test_a_good_inventory_still_reads(capsys, tmp_path: Path) -> None:
    code, err = run(capsys, "plan", inventory(tmp_path))
    assert code in (0, 3), err


@pytest.mark.parametrize("verb", ["plan", "init"])
@pytest.mark.parametrize("what", ["fifo", "bomb", "link loop", "folder loop", "not yaml", "huge integer"])
def test_an_inventory_ansible_would_hang_on_is_refused_naming_the_file(capsys, tmp_path, verb, what) -> None:
    inv = inventory(tmp_path)
    target = inv / "group_vars" / "all"
    if what == "fifo":
        os.mkfifo(target)
    elif what == "bomb":
        target.with_suffix(".yml").write_text(BOMB)
    elif what == "link loop":
        target.symlink_to("all")
    elif what == "folder loop":
        (inv / "group_vars" / "sub").mkdir()
        (inv / "group_vars" / "sub" / "up").symlink_to("..")
    elif what == "not yaml":
        target.with_suffix(".yml").write_text("a: [1, 2\n")
    else:
        target.with_suffix(".yml").write_text("n: " + "9" * 5000 + "\n")
    before = tree_hash(inv)
    started = time.monotonic()
    code, err = run(capsys, verb, inv)
    assert code == 2, err
    assert time.monotonic() - started < 60
    assert "group_vars" in err, err  # the file is named
    assert "Traceback" not in err
    assert tree_hash(inv) == before


@pytest.mark.parametrize("verb", ["plan", "init"])
@pytest.mark.parametrize(
    "template",
    [
        "{{ lookup('pipe', 'touch MARKER') }}",
        "{{ lookup('ansible.builtin.pipe', 'touch MARKER') }}",
        "{{ query('pipe', 'touch MARKER') | first }}",
        "{{ lookup('pipe', 'touch MARKER', errors='ignore') | default('x', true) }}",
        "{{ lookup('file', '/etc/hostname') }}",
        "{{ lookup('env', 'HOME') }}",
    ],
)
def test_a_dry_run_runs_no_lookup_the_inventory_holds(capsys, tmp_path, monkeypatch, verb, template) -> None:
    monkeypatch.chdir(tmp_path)
    host = GOOD_HOST.replace("name: gpu", f'name: "{template}"'.replace("MARKER", str(tmp_path / "ran")))
    inv = inventory(tmp_path, host)
    before = tree_hash(tmp_path)
    code, err = run(capsys, verb, inv)
    assert code == 2, err
    assert "gpuprov_host uses lookup" in err and "--trust-inventory" in err, err
    assert not (tmp_path / "ran").exists()
    assert tree_hash(tmp_path) == before


def test_trust_inventory_templates_as_the_play_does(capsys, tmp_path) -> None:
    marker = tmp_path / "ran"
    name = f"name: \"gpu{{{{ lookup('pipe', 'touch {marker}') }}}}\""
    inv = inventory(tmp_path, GOOD_HOST.replace("name: gpu", name))
    code, err = run(capsys, "plan", inv, "--trust-inventory")
    assert code in (0, 3), err
    assert marker.exists()


def test_a_pure_lookup_is_evaluated(capsys, tmp_path) -> None:
    name = "name: \"{{ lookup('vars', 'gpu_name') }}\""
    inv = inventory(tmp_path, "gpu_name: gpu\n" + GOOD_HOST.replace("name: gpu", name))
    code, err = run(capsys, "plan", inv)
    assert code in (0, 3), err


def test_an_inventory_script_is_not_run_without_trust(capsys, tmp_path) -> None:
    marker = tmp_path / "ran"
    inv = inventory(tmp_path)
    script = inv / "dynamic.sh"
    script.write_text(f'#!/bin/sh\ntouch {marker}\necho \'{{"all": {{"hosts": ["node1"]}}}}\'\n')
    script.chmod(0o755)
    code = main(["plan", "--root", str(H100), "-i", str(inv), "--host", "node1"])
    capsys.readouterr()
    assert code in (0, 3)
    assert not marker.exists()
    code = main(["plan", "--root", str(H100), "-i", str(inv), "--host", "node1", "--trust-inventory"])
    capsys.readouterr()
    assert marker.exists()


def test_ansible_reading_past_its_time_limit_is_stopped(capsys, tmp_path, monkeypatch) -> None:
    """An inventory script that never ends (trusted: it is run): the child is killed, with its group."""
    monkeypatch.setattr(cli_inventory, "READ_TIME_LIMIT", 5)
    inv = tmp_path / "inv"
    inv.mkdir()
    script = inv / "hang.sh"
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\nexec sleep 600\n")
    script.chmod(0o755)
    started = time.monotonic()
    code = main(["plan", "--root", str(H100), "-i", str(script), "--host", "node1", "--trust-inventory"])
    err = capsys.readouterr().err
    assert code == 2 and "did not finish" in err, err
    assert time.monotonic() - started < 60
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")  # the script's sleep went with the group


@pytest.mark.parametrize("what", ["fifo", "bomb"])
def test_the_fleet_refuses_an_inventory_ansible_would_hang_on(tmp_path, what) -> None:
    inv = inventory(tmp_path)
    if what == "fifo":
        os.mkfifo(inv / "group_vars" / "all")
    else:
        (inv / "group_vars" / "all.yml").write_text(BOMB)
    before = tree_hash(inv)
    proc = subprocess.run(
        [sys.executable, "-m", "gpuprov", "fleet", "-i", str(inv / "hosts.yml")],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "group_vars" in proc.stderr and "Traceback" not in proc.stderr
    assert tree_hash(inv) == before


def test_the_fleet_play_is_stopped_at_its_time_limit(tmp_path) -> None:
    script = tmp_path / "hang.sh"  # a dynamic inventory that never answers: ansible-playbook waits on it
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\nexec sleep 600\n")
    script.chmod(0o755)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "gpuprov", "fleet", "-i", str(script), "--time-limit", "8"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and "did not finish in 8" in proc.stderr, proc.stderr
    assert time.monotonic() - started < 60
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")
