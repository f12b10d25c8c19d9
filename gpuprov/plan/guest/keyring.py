"""OpenPGP public keys for apt's ``signed-by`` keyrings, without gpg.

NVIDIA publishes its repository key ASCII-armored (``gpgkey``); apt wants a
binary keyring for a ``.gpg`` ``signed-by`` file. :func:`dearmor` does what
``gpg --dearmor`` does, :func:`fingerprints` reads the primary keys'
fingerprints (v4: SHA-1 over the key packet) so a play can pin the key it
expects. Standard library only: the modules apt_keyring and guest_toolkit
ship it to the target, which may have no gpg.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from ...core.plan import WRITE_FILE, Action, Plan

ARMOR_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
ARMOR_END = "-----END PGP PUBLIC KEY BLOCK-----"
TAG_PUBLIC_KEY = 6
TAG_PUBLIC_SUBKEY = 14


class KeyDataError(ValueError):
    """The data is not an OpenPGP public key (the message says what it is instead), or not the pinned one
    (``found``: the fingerprints it has)."""

    def __init__(self, message: str, found: list[str] | None = None) -> None:
        super().__init__(message)
        self.found = found or []


def _crc24(data: bytes) -> int:
    crc = 0xB704CE
    for byte in data:
        crc ^= byte << 16
        for _bit in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def dearmor(data: bytes) -> bytes:
    """Binary key packets from an armored key (every PUBLIC KEY BLOCK in it),
    or ``data`` itself when it is binary already."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return data
    if ARMOR_BEGIN not in text:
        if data[:1] and data[0] & 0x80:  # a packet header: binary
            return data
        raise KeyDataError("neither an armored (-----BEGIN PGP PUBLIC KEY BLOCK-----) nor a binary OpenPGP key")
    out = b""
    for block in text.split(ARMOR_BEGIN)[1:]:
        if ARMOR_END not in block:
            raise KeyDataError("an armored key block without its END line (truncated download?)")
        lines = block.split(ARMOR_END)[0].strip().splitlines()
        body, crc = [], None
        for line in (ln.strip() for ln in lines):
            if ":" in line:  # an armor header (Version:, Comment:); base64 has no colon
                continue
            if line.startswith("=") and len(line) == 5:
                crc = line[1:]
            elif line:
                body.append(line)
        try:
            packets = base64.b64decode("".join(body), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise KeyDataError(f"the armored key's base64 does not decode ({exc})") from None
        if crc is not None:
            want = int.from_bytes(base64.b64decode(crc), "big")
            if _crc24(packets) != want:
                raise KeyDataError("the armored key's checksum does not match its content (corrupted download?)")
        out += packets
    return out


def _packets(data: bytes) -> list[tuple[int, bytes]]:
    """(tag, body) of each packet; raises on a malformed stream."""
    packets, i = [], 0
    while i < len(data):
        header = data[i]
        if not header & 0x80:
            raise KeyDataError(f"byte {i} is not an OpenPGP packet header: not a binary key")
        if header & 0x40:  # new format
            tag = header & 0x3F
            first = data[i + 1] if i + 1 < len(data) else None
            if first is None:
                raise KeyDataError("truncated packet header")
            if first < 192:
                length, i = first, i + 2
            elif first < 224:
                if i + 2 >= len(data):
                    raise KeyDataError("truncated packet header")
                length, i = ((first - 192) << 8) + data[i + 2] + 192, i + 3
            elif first == 255:
                length, i = int.from_bytes(data[i + 2 : i + 6], "big"), i + 6
            else:
                raise KeyDataError("a partial-length packet: not a key")
        else:  # old format
            tag, kind = (header >> 2) & 0x0F, header & 0x03
            if kind == 3:
                raise KeyDataError("an indeterminate-length packet: not a key")
            size = (1, 2, 4)[kind]
            length, i = int.from_bytes(data[i + 1 : i + 1 + size], "big"), i + 1 + size
        if i + length > len(data):
            raise KeyDataError("a packet runs past the end of the data (truncated key?)")
        packets.append((tag, data[i : i + length]))
        i += length
    return packets


def fingerprints(binary: bytes) -> list[str]:
    """Upper-case hex fingerprints of the primary keys (v4: 40 digits, v5/v6: 64)."""
    out = []
    for tag, body in _packets(binary):
        if tag != TAG_PUBLIC_KEY or not body:
            continue
        version = body[0]
        if version == 4:
            digest = hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body, usedforsecurity=False)
        elif version == 5:
            digest = hashlib.sha256(b"\x9a" + len(body).to_bytes(4, "big") + body)
        elif version == 6:
            digest = hashlib.sha256(b"\x9b" + len(body).to_bytes(4, "big") + body)
        else:
            raise KeyDataError(f"an OpenPGP v{version} key: too old to trust")
        out.append(digest.hexdigest().upper())
    if not out:
        raise KeyDataError("OpenPGP data without a public key packet (a signature or a private key?)")
    return out


def normalize_fingerprint(text: str) -> str:
    return "".join(text.split()).upper().removeprefix("0X")


def fetch_failed(url: str, why: str) -> str:
    """The refusal when the key cannot be fetched (the guest has no route to it, say)."""
    return (
        f"could not fetch the key from {url}: {why}, nothing changed; "
        "check the guest reaches it, or give the key as a file on the controller"
    )


def load_key(raw: bytes, source: str, fingerprint: str) -> tuple[bytes, list[str]]:
    """(binary keyring, its primary fingerprints) from armored or binary ``raw``; raises
    :class:`KeyDataError` with the whole refusal (naming ``source``) when it is not a key or
    its fingerprint is not the pinned ``fingerprint`` (empty: no pin)."""
    try:
        binary = dearmor(raw)
        found = fingerprints(binary)
    except KeyDataError as exc:
        raise KeyDataError(f"the key from {source} is not an OpenPGP public key: {exc}, nothing changed") from None
    want = normalize_fingerprint(fingerprint)
    if want and want not in found:
        raise KeyDataError(
            f"the key from {source} has fingerprint {', '.join(found)}, not the expected {want}, nothing changed: "
            "the repository's key changed or the download was tampered with; check the publisher's announcement",
            found,
        )
    return binary, found


def plan_keyring(
    dest: str, binary: bytes, found: list[str], mode: int, current: bytes | None, current_mode: int | None
) -> Plan:
    """Write ``binary`` (fingerprints ``found``) to ``dest`` (root-relative) with ``mode``, unless
    it holds exactly that already; --diff names the keyring and its fingerprints, not its bytes."""
    plan = Plan()
    if current == binary and current_mode == mode:
        return plan
    shown = (
        f"/{dest}: {'absent' if current is None else 'other key data'}\n",
        f"/{dest}: key {', '.join(found)}\n",
    )
    why = f"apt keyring, key {', '.join(found)}"
    plan.actions.append(Action(WRITE_FILE, why, path=dest, content=binary, before=current, mode=mode, shown=shown))
    return plan
