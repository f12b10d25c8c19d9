"""The collection gpuprov.kvm as a user gets it: its tarball (dev/tools/build_collection.py,
``ansible-galaxy collection build``) installed into an empty collections path, then used
from a directory outside the checkout, with no ansible.cfg of the repo and no other
collection on the path: ``ansible-doc`` shows every module by FQCN, every playbook runs by
FQCN, every relative link of its Markdown resolves, and a play runs FQCN modules and a FQCN
role against staged roots on a target Python that has neither gpuprov nor ansible.

Twice: with the ansible-core of .venv (pyproject's ansible extra) and with the oldest release
meta/runtime.yml's ``requires_ansible`` admits, from a virtualenv of that ansible-core alone
made once under ``${GPUPROV_CACHE:-~/.cache/gpuprov}/ansible-core-X.Y`` (70 MB, ~20 s; the
package index must be reachable then)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.release import __version__ as ansible_core_version

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
    "guest_gpu_sharing",
    "guest_nvidia_driver",
    "host_drain",
    "host_model",
    "host_plan",
    "iommu_host",
    "vfio_host",
    "vgpu_host",
]
PLAYBOOKS = sorted(p.stem for p in (REPO / "playbooks").glob("*.yml"))
# Old playbook names (no valid FQCN name) kept for one release -> their new names.
DEPRECATED_PLAYBOOKS = {"gpu-passthrough": "gpu_passthrough"}
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


def series(version: str) -> str:
    return ".".join(version.split(".")[:2])


def oldest_release() -> str:
    """The lower bound of meta/runtime.yml's requires_ansible (">=2.18" -> "2.18")."""
    runtime = yaml.safe_load((REPO / "collection" / "meta" / "runtime.yml").read_text())
    match = re.fullmatch(r">=\s*(\d+\.\d+)(?:\.0)?", runtime["requires_ansible"])
    assert match, f"requires_ansible {runtime['requires_ansible']!r}: open-ended, >=X.Y"
    return match[1]


CURRENT = series(ansible_core_version)
RELEASES = [CURRENT, oldest_release()]


def ansible_core_bin(release: str) -> Path:
    """The bin/ of an ansible-core ``release`` (X.Y): .venv's, or a cached venv of that release alone."""
    if release == CURRENT:
        return BIN
    cache = Path(os.environ.get("GPUPROV_CACHE") or Path.home() / ".cache" / "gpuprov")
    venv = cache / f"ansible-core-{release}"
    done = venv / ".gpuprov-complete"  # written last: a venv cut short is made again
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".ansible-core-{release}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            shutil.rmtree(venv, ignore_errors=True)
            major, minor = release.split(".")
            pin = f"ansible-core>={release},<{major}.{int(minor) + 1}"
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            for cmd in ([sys.executable, "-m", "venv", str(venv)], [*pip, pin]):
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
                assert proc.returncode == 0, f"{cmd}: {proc.stdout}{proc.stderr}"
            done.write_text(release + "\n")
    return venv / "bin"


@pytest.fixture(scope="session")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tool = build_collection_tool()
    tool.assemble()
    return tool.tarball(tmp_path_factory.mktemp("dist"))


# The oldest release runs from its cached venv, made by whichever Python made it first: its
# controller is that venv's Python, not this one, so Debian's pass (tests/conftest.py) leaves it
# to the first pass and plays the current release, installed in its own venv.
_RELEASE_PARAMS = [
    pytest.param(r, id=f"ansible-core-{r}", marks=[pytest.mark.interpreter_independent] * (r != CURRENT))
    for r in RELEASES
]


@pytest.fixture(scope="session", params=_RELEASE_PARAMS)
def installed(
    request: pytest.FixtureRequest, tarball: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The tarball installed into an empty collections path by one ansible-core release: that
    release's bin/, the tarball, the collections path, a work directory and the env."""
    bin_dir = ansible_core_bin(request.param)
    top = tmp_path_factory.mktemp(f"collection-{request.param}")
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
    galaxy = [str(bin_dir / "ansible-galaxy"), "collection", "install", str(tarball), "-p", str(collections)]
    proc = subprocess.run(galaxy, cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "does not support Ansible version" not in proc.stdout + proc.stderr  # requires_ansible admits it
    version = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "--version"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert f"[core {request.param}." in version, version
    return {"bin": bin_dir, "tarball": tarball, "collections": collections, "work": work, "env": env}


def test_the_tarball_is_the_collection_without_the_command_line(tarball: Path) -> None:
    with tarfile.open(tarball) as tar:
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
    assert sorted(n[len("playbooks/") : -4] for n in names if n.startswith("playbooks/")) == PLAYBOOKS
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
    cmd = [str(installed["bin"] / "ansible-doc"), *(f"gpuprov.kvm.{m}" for m in MODULES)]
    proc = subprocess.run(cmd, cwd=installed["work"], env=installed["env"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    for module in MODULES:
        assert f"> MODULE gpuprov.kvm.{module} ({root}/plugins/modules/{module}.py)" in proc.stdout
    listed = subprocess.run(
        [str(installed["bin"] / "ansible-doc"), "-l", "gpuprov.kvm"],
        cwd=installed["work"],
        env=installed["env"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()) == [f"gpuprov.kvm.{m}" for m in MODULES]


def test_every_playbook_is_callable_by_fqcn(installed: dict[str, Any]) -> None:
    """ansible-playbook gpuprov.kvm.NAME finds every playbook (a hyphen is no FQCN name: only the
    deprecated old names have one, each kept as an import of its new name)."""
    names = [p for p in PLAYBOOKS if p not in DEPRECATED_PLAYBOOKS]
    assert set(DEPRECATED_PLAYBOOKS.values()) <= set(names)
    assert not [n for n in names if not re.fullmatch(r"[a-z_][a-z0-9_]*", n)], "a playbook name is no FQCN name"
    cmd = [str(installed["bin"] / "ansible-playbook"), "-i", "localhost,", "--syntax-check"]
    proc = subprocess.run(
        cmd + [f"gpuprov.kvm.{n}" for n in names],
        cwd=installed["work"],
        env=installed["env"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = installed["collections"] / "ansible_collections" / "gpuprov" / "kvm"
    assert re.findall(r"^playbook: (.*)$", proc.stdout, re.M) == [f"{root}/playbooks/{n}.yml" for n in names]


def test_the_readme_names_every_playbook_role_and_module_by_fqcn() -> None:
    readme = (REPO / "collection" / "README.md").read_text()
    named = set(re.findall(r"`gpuprov\.kvm\.([a-z0-9_]+)`", readme))
    playbooks = {p for p in PLAYBOOKS if p not in DEPRECATED_PLAYBOOKS}
    assert playbooks | set(ROLES) | set(MODULES) <= named, (playbooks | set(ROLES) | set(MODULES)) - named


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
        cmd = [str(installed["bin"] / "ansible-playbook"), "-i", "localhost,", "play.yml", "-e", json.dumps(variables)]
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
    cmd = [str(installed["bin"] / "ansible-galaxy"), "collection", "list", "--format", "json"]
    proc = subprocess.run(cmd, cwd=installed["work"], env=installed["env"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    found = {
        (path, name, info["version"])
        for path, collections in json.loads(proc.stdout).items()
        for name, info in collections.items()
        if not name.startswith("ansible._")  # ansible-core's own, internal
    }
    assert found == {(str(installed["collections"] / "ansible_collections"), "gpuprov.kvm", gpuprov.__version__)}


def test_every_collection_used_is_declared() -> None:
    """galaxy.yml declares no dependency: every module, callback or lookup the roles, the playbooks and
    the command line name is ansible.builtin's or the collection's own (issue #50: the fleet needed
    ansible.posix, undeclared)."""
    from gpuprov.cli import fleet

    used = {fleet.CALLBACK.rsplit(".", 1)[0]}
    fqcn = re.compile(r"^\s*(?:-\s*)?([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+:", re.M)
    lookups = re.compile(r"(?:lookup|query)\(\s*['\"]([a-z0-9_]+\.[a-z0-9_]+)\.")
    for path in [*REPO.glob("roles/**/*.yml"), *REPO.glob("playbooks/**/*.yml")]:
        text = path.read_text()
        used |= set(fqcn.findall(text)) | set(lookups.findall(text))
    galaxy = (REPO / "collection" / "galaxy.yml").read_text()
    assert re.search(r"^dependencies: \{\}$", galaxy, re.M)
    assert used <= {"ansible.builtin", "gpuprov.kvm"}, used
