"""Repository keys for apt's signed-by without gpg on the target
(gpuprov.guest.keyring, the guest_container_toolkit role's apt_keyring module),
checked against gpg itself: the same binary keyring as `gpg --export`, the same
fingerprints as `gpg --show-keys`."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest

from gpuprov.plan.guest.keyring import KeyDataError, dearmor, fingerprints, normalize_fingerprint
from tests.conftest import tree_digest
from tests.modules.test_modules import bare_python as bare_python  # a fixture: re-exported for pytest
from tests.modules.test_modules import run_module
from tests.plan.conftest import gpg

DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
needs_gpg = pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg is not installed")


def test_dearmor_gives_what_gpg_exports(gpg_key) -> None:
    assert dearmor(gpg_key["armored"]) == gpg_key["binary"]
    assert dearmor(gpg_key["binary"]) == gpg_key["binary"]  # binary stays as it is
    assert fingerprints(gpg_key["binary"]) == [gpg_key["fpr"]]


def test_armor_headers_are_skipped(gpg_key) -> None:
    text = gpg_key["armored"].decode()
    with_headers = text.replace(
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\n",
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\nComment: gpuprov test\nVersion: GnuPG v2\n",
    )
    assert dearmor(with_headers.encode()) == gpg_key["binary"]


@needs_gpg
@pytest.mark.skipif(not DEBIAN_KEYRING.exists(), reason="no debian-archive-keyring here")
def test_fingerprints_of_debians_archive_keyring_match_gpg(tmp_path) -> None:
    tmp_path.chmod(0o700)
    colons = gpg(tmp_path, "--show-keys", "--with-colons", str(DEBIAN_KEYRING)).decode().splitlines()
    # The first fpr line after each pub line (revokers, rvk, may come between) is the primary key's.
    primary = [
        next(f.split(":")[9] for f in colons[i:] if f.startswith("fpr:"))
        for i, line in enumerate(colons)
        if line.startswith("pub:")
    ]
    assert sorted(fingerprints(DEBIAN_KEYRING.read_bytes())) == sorted(primary) and len(primary) > 3


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"<!DOCTYPE html><html><body>404</body></html>", "neither an armored"),
        (b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ", "without its END line"),
        (b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ!!\n-----END PGP PUBLIC KEY BLOCK-----\n", "does not decode"),
    ],
)
def test_data_that_is_no_key_is_named(data: bytes, text: str) -> None:
    with pytest.raises(KeyDataError, match=text):
        fingerprints(dearmor(data))


def test_a_corrupted_armored_key_is_refused(gpg_key) -> None:
    lines = gpg_key["armored"].decode().splitlines()
    body = next(i for i, line in enumerate(lines) if line.startswith("mDME"))
    lines[body] = lines[body][:10] + ("A" if lines[body][10] != "A" else "B") + lines[body][11:]
    with pytest.raises(KeyDataError, match="checksum does not match"):
        dearmor("\n".join(lines).encode())


def test_a_truncated_binary_key_is_refused(gpg_key) -> None:
    with pytest.raises(KeyDataError, match="runs past the end"):
        fingerprints(gpg_key["binary"][:40])


def test_fingerprints_are_compared_without_spaces_or_case() -> None:
    assert normalize_fingerprint("c95b 321b 61e8 8c18  09c4 f759 ddca e044 f796 ecb0") == (
        "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
    )


def test_the_module_from_a_url_check_apply_idempotent(bare_python, gpg_key, tmp_path) -> None:
    key = tmp_path / "gpgkey"
    key.write_bytes(gpg_key["armored"])
    dest = tmp_path / "keyrings" / "nvidia-container-toolkit.gpg"
    args = {"url": f"file://{key}", "dest": str(dest), "fingerprint": gpg_key["fpr"].lower()}
    dry = run_module(bare_python, "apt_keyring", args, check=True)
    assert dry["changed"] is True and not dest.exists()
    first = run_module(bare_python, "apt_keyring", args)
    assert first["changed"] is True and first["fingerprints"] == [gpg_key["fpr"]]
    assert dest.read_bytes() == gpg_key["binary"] and dest.stat().st_mode & 0o777 == 0o644
    assert run_module(bare_python, "apt_keyring", args)["changed"] is False


def test_the_module_from_data_and_a_wrong_fingerprint(bare_python, gpg_key, tmp_path) -> None:
    dest = tmp_path / "k.gpg"
    data = base64.b64encode(gpg_key["binary"]).decode()
    wrong = run_module(bare_python, "apt_keyring", {"data": data, "dest": str(dest), "fingerprint": "00" * 20})
    assert wrong["failed"] is True and not dest.exists()
    assert f"has fingerprint {gpg_key['fpr']}, not the expected {'00' * 20}, nothing changed" in wrong["msg"]
    ok = run_module(bare_python, "apt_keyring", {"data": data, "dest": str(dest)})
    assert ok["changed"] is True and dest.read_bytes() == gpg_key["binary"]


def test_the_module_refuses_a_page_that_is_no_key(bare_python, tmp_path) -> None:
    page = tmp_path / "gpgkey"
    page.write_text("<html>rate limited</html>")
    (tmp_path / "keyrings").mkdir()
    before = tree_digest(tmp_path)
    result = run_module(bare_python, "apt_keyring", {"url": f"file://{page}", "dest": str(tmp_path / "keyrings/k.gpg")})
    assert result["failed"] is True
    assert result["msg"].startswith(f"the key from file://{page} is not an OpenPGP public key: neither an armored")
    assert tree_digest(tmp_path) == before
