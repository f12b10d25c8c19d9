"""Fixtures the planner tests share."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def gpg(home: Path, *args: str) -> bytes:
    return subprocess.run(
        ["gpg", "--batch", "--quiet", "--homedir", str(home), *args], capture_output=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def gpg_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A repository key made by gpg: armored (as NVIDIA publishes it), binary, and its fingerprint as
    gpg prints it. Making it starts a gpg-agent for that home, which would outlive the run: stopped
    at the end."""
    if shutil.which("gpg") is None:
        pytest.skip("gpg is not installed")
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    try:
        uid = "gpuprov test <test@gpuprov.invalid>"
        gpg(home, "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
        colons = gpg(home, "--with-colons", "--fingerprint").decode()
        fpr = next(line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:"))
        yield {"home": home, "armored": gpg(home, "--armor", "--export"), "binary": gpg(home, "--export"), "fpr": fpr}
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)
