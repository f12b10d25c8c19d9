"""The collection gpuprov.kvm as a user gets it: its tarball (dev/tools/build_collection.py,
``ansible-galaxy collection build``) installed into an empty collections path, then used
from a directory outside the checkout, with no ansible.cfg of the repo and no other
collection on the path: ``ansible-doc`` shows every module by FQCN, and a play runs FQCN
modules and a FQCN role against staged roots on a target Python that has neither gpuprov
nor ansible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

import gpuprov
from tests.conftest import build_collection_tool, tree_digest
from tests.house.test_docs_links import relative_links
from tests.modules.test_modules import bare_python as bare_python  # fixtures: re-exported for pytest
from tests.modules.test_modules import staged as staged

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))
ROLES = [
    "gpu_vms",
    "guest_container_toolkit",
    "guest_nvidia_driver",
    "host_model",
    "host_plan",
    "iommu_host",
    "vfio_host",
    "vgpu_host",
]
# The command line's modules: in the wheel, never in the collection.
CLI_ONLY = ["__main__.py", "cli.py", "capture.py", "debpkg.py", "lab.py", "plancmd.py", "table.py"]

PLAY = """\
---
- name: Modules of gpuprov.kvm, from the installed collection
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Facts of a captured H100 guest
      gpuprov.kvm.gpu_host_facts:
        root: "{{ facts_root }}"

    - name: What vfio_bind would do (check mode)
      gpuprov.kvm.vfio_bind:
        devices: ["0000:01:00.0"]
        root: "{{ bind_root }}"
      check_mode: true
      register: dry

    - name: A refusal (the boot display)
      gpuprov.kvm.vfio_bind:
        devices: ["0000:00:02.0"]
        root: "{{ refuse_root }}"
      register: refused
      ignore_errors: true

- name: A role of gpuprov.kvm, from the installed collection
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: gpuprov.kvm.vfio_host
      vars:
        vfio_host_root: "{{ bind_root }}"
        vfio_host_devices: ["0000:01:00.0"]
  post_tasks:
    - name: Keep the results for the test
      ansible.builtin.copy:
        dest: "{{ results_file }}"
        content: >-
          {{ {'facts': ansible_facts.gpuprov, 'dry': dry, 'refused': refused, 'bind': __vfio_host_bind} | to_json }}
        mode: "0644"
"""


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Build the tarball, install it into an empty collections path; the tarball, that path and the env."""
    tool = build_collection_tool()
    tool.assemble()
    top = tmp_path_factory.mktemp("collection")
    tarball = tool.tarball(top / "dist")
    collections = top / "collections"
    work = top / "work"  # outside the checkout: no ansible.cfg here
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(collections),
        ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",  # not even the collections of the ansible package
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCALHOST_WARNING="0",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
    )
    galaxy = [str(BIN / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(collections)]
    proc = subprocess.run(galaxy, cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"tarball": tarball, "collections": collections, "work": work, "env": env}


def test_the_tarball_is_the_collection_without_the_command_line(installed: dict[str, Any]) -> None:
    with tarfile.open(installed["tarball"]) as tar:
        members = tar.getmembers()
        manifest = json.load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    names = {m.name for m in members}
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == ("gpuprov", "kvm", gpuprov.__version__)
    assert info["license"] == ["Apache-2.0"] and "LICENSE" in names and "meta/runtime.yml" in names
    assert sorted(n[len("plugins/modules/") : -3] for n in names if n.startswith("plugins/modules/")) == MODULES
    utils = "plugins/module_utils/gpuprov/"
    assert {f"{utils}facts/sysfs.py", f"{utils}modules/common.py", f"{utils}plan/host/vfio.py"} <= names
    assert not [n for n in names if n.startswith(utils) and n[len(utils) :] in CLI_ONLY]
    assert {n.split("/")[1] for n in names if n.startswith("roles/") and n.count("/") > 1} == set(ROLES)
    assert {"playbooks/gpu_passthrough.yml", "playbooks/gpu-passthrough.yml"} <= names
    assert "roles/vgpu_host/files/gpuprov-vgpu.pyz" in names  # the boot unit's zipapp, built
    assert not [m.name for m in members if m.issym() or m.islnk()], "links trip ansible-test sanity"
    assert not [n for n in names if "__pycache__" in n or n.startswith("tests/output")]


def test_every_relative_link_of_the_installed_collection_resolves(installed: dict[str, Any]) -> None:
    """Its README is the collection's (collection/README.md), and every relative link of every
    Markdown file, as installed, leads to a file there: the docs it links come with it."""
    root = installed["collections"] / "ansible_collections" / "gpuprov" / "kvm"
    assert (root / "README.md").read_text() == (REPO / "collection" / "README.md").read_text()
    pages = sorted(root.rglob("*.md"))
    assert {"README.md", "docs/guides/passthrough.md", "docs/reference/modules.md"} <= {
        p.relative_to(root).as_posix() for p in pages
    }
    broken = {}
    for page in pages:
        for target in relative_links(page.read_text(encoding="utf-8")):
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not (path.is_file() and path.is_relative_to(root)):
                broken.setdefault(page.relative_to(root).as_posix(), []).append(target)
    assert not broken, broken


def test_ansible_doc_shows_every_module_by_fqcn(installed: dict[str, Any]) -> None:
    root = installed["collections"] / "ansible_collections" / "gpuprov" / "kvm"
    cmd = [str(BIN / "ansible-doc"), *(f"gpuprov.kvm.{m}" for m in MODULES)]
    proc = subprocess.run(cmd, cwd=installed["work"], env=installed["env"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    for module in MODULES:
        assert f"> MODULE gpuprov.kvm.{module} ({root}/plugins/modules/{module}.py)" in proc.stdout
    listed = subprocess.run(
        [str(BIN / "ansible-doc"), "-l", "gpuprov.kvm"],
        cwd=installed["work"],
        env=installed["env"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()) == [f"gpuprov.kvm.{m}" for m in MODULES]


def test_a_play_outside_the_repo_runs_the_modules_and_a_role(
    installed: dict[str, Any], bare_python: str, staged, host_root
) -> None:
    work: Path = installed["work"]
    bind_root, refuse_root = staged("gpu-audio"), staged("boot-vga")
    refuse_before = tree_digest(refuse_root)
    (work / "play.yml").write_text(PLAY)

    def play(results: Path) -> dict[str, Any]:
        variables = {
            "ansible_python_interpreter": bare_python,
            "facts_root": str(host_root("h100-passthrough-guest")),
            "bind_root": str(bind_root),
            "refuse_root": str(refuse_root),
            "results_file": str(results),
        }
        cmd = [str(BIN / "ansible-playbook"), "-i", "localhost,", "play.yml", "-e", json.dumps(variables)]
        proc = subprocess.run(cmd, cwd=work, env=installed["env"], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        return json.loads(results.read_text())

    first = play(work / "first.json")
    (gpu,) = first["facts"]["gpus"]
    assert (gpu["address"], gpu["ready"]) == ("0000:00:06.0", False)
    assert first["dry"]["changed"] is True and first["dry"]["devices"] == ["0000:01:00.0", "0000:01:00.1"]
    assert first["refused"]["failed"] is True and "is the boot display" in first["refused"]["msg"]
    assert tree_digest(refuse_root) == refuse_before
    assert first["bind"]["changed"] is True
    assert (bind_root / "etc/udev/rules.d/61-gpuprov-vfio.rules").exists()

    again = play(work / "again.json")
    assert again["dry"]["changed"] is False and again["bind"]["changed"] is False


def test_nothing_of_the_checkout_was_used(installed: dict[str, Any]) -> None:
    """The play's gpuprov.kvm is the installed one: the only collection the environment can see."""
    cmd = [str(BIN / "ansible-galaxy"), "collection", "list", "--format", "json"]
    proc = subprocess.run(cmd, cwd=installed["work"], env=installed["env"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    found = {
        (path, name, info["version"])
        for path, collections in json.loads(proc.stdout).items()
        for name, info in collections.items()
        if not name.startswith("ansible._")  # ansible-core's own, internal
    }
    assert found == {(str(installed["collections"] / "ansible_collections"), "gpuprov.kvm", gpuprov.__version__)}
