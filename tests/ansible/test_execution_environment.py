"""execution-environment.yml, the execution environment (ansible-builder, schema version 3) of
AWX and Automation Platform users: ``ansible-builder create`` accepts it and writes the build
context (no image is built here: that needs the base image from its registry), and the steps
the image build runs on that context work: its galaxy step installs gpuprov.kvm from the
assembled collection, and the builder's introspection finds the collection's needs
(meta/execution-environment.yml: ssh, no Python package). Its ansible-core is the tested range."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import gpuprov
from tests.ansible.test_collection import CURRENT, oldest_release
from tests.conftest import build_collection_tool

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEFINITION = REPO / "execution-environment.yml"


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build context ``ansible-builder create`` writes, from the assembled collection."""
    build_collection_tool().assemble()
    out = tmp_path_factory.mktemp("ee") / "context"
    proc = subprocess.run(
        [
            str(BIN / "ansible-builder"),
            "create",
            "-f",
            str(DEFINITION),
            "-c",
            str(out),
            "--output-filename",
            "Containerfile",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No matches" not in proc.stdout + proc.stderr, "additional_build_files found nothing: is it assembled?"
    return out


def test_the_definition_is_schema_3_with_the_tested_ansible_core(context: Path) -> None:
    definition = yaml.safe_load(DEFINITION.read_text())
    assert definition["version"] == 3
    containerfile = (context / "Containerfile").read_text()
    major, minor = CURRENT.split(".")
    pin = f"ansible-core>={oldest_release()},<{major}.{int(minor) + 1}"
    assert definition["dependencies"]["ansible_core"]["package_pip"] == pin
    assert re.search(rf'^ARG ANSIBLE_INSTALL_REFS="{re.escape(pin)} ansible-runner"$', containerfile, re.M)
    assert re.search(r'^ARG PYCMD="/usr/bin/python3\.11"$', containerfile, re.M)  # the tested controller Python


def test_its_galaxy_step_installs_the_collection_and_introspection_finds_its_needs(
    context: Path, tmp_path: Path
) -> None:
    build = context / "_build"
    collections = tmp_path / "collections"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_GALAXY_DISABLE_GPG_VERIFY"] = "1"
    # What the image's galaxy stage runs, in WORKDIR /build (here: the context's _build).
    galaxy = [str(BIN / "ansible-galaxy"), "collection", "install", "-r", "requirements.yml"]
    proc = subprocess.run(
        [*galaxy, "--collections-path", str(collections)],
        cwd=build,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = yaml.safe_load((collections / "ansible_collections/gpuprov/kvm/MANIFEST.json").read_text())
    assert manifest["collection_info"]["version"] == gpuprov.__version__
    # What its builder stage runs: the dependencies of every installed collection.
    proc = subprocess.run(
        [sys.executable, str(build / "scripts/introspect.py"), "introspect", str(collections)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = yaml.safe_load(proc.stdout)
    assert found["python"] == []
    assert "openssh-clients [platform:rpm]  # from collection gpuprov.kvm" in found["system"]
