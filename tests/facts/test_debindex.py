"""gpuprov.facts.debindex: Debian's version order, dependencies against dpkg's status and an offline
directory, and .deb control files read as data (the real toolkit packages in ../shared, and hostile files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuprov.facts.debindex import (
    DebError,
    compare_versions,
    control_fields,
    index_set,
    installed_set,
    missing_dependencies,
    offline_index,
    package_file_ok,
    parse_depends,
    read_regular,
)

TOOLKIT_DEBS = Path(__file__).resolve().parents[3] / "shared/fixtures/toolkit-debs"


@pytest.mark.parametrize(
    ("a", "b", "sign"),
    [
        ("1.0", "1.0", 0),
        ("1.0~rc1", "1.0", -1),
        ("1:0.1", "2.0", 1),
        ("1.0-1", "1.0-2", -1),
        ("2.36-9+deb12u4", "2.36", 1),
        ("1.10", "1.9", 1),
        ("1.0a", "1.0", 1),
        ("1.0+b1", "1.0", 1),
        ("20.10.24+dfsg1-1+deb12u1+b6", "20.10.24+dfsg1-1", 1),
        ("1.19.0~src.d34b3046-1", "1.19.0~", 1),
        ("1.19.0~src.d34b3046-1", "2.0.0", -1),
    ],
)
def test_versions_compare_as_dpkg_does(a: str, b: str, sign: int) -> None:
    c = compare_versions(a, b)
    assert (c > 0) - (c < 0) == sign
    c = compare_versions(b, a)
    assert (c > 0) - (c < 0) == -sign


def test_dependencies_with_alternatives_versions_and_provides() -> None:
    assert [[str(a) for a in g] for g in parse_depends("a (>= 1), b | c:any, d [amd64] (<< 2)")] == [
        ["a (>= 1)"],
        ["b", "c"],
        ["d"],
    ]
    status = installed_set(
        "Package: libc6\nStatus: install ok installed\nVersion: 2.39-0ubuntu8\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n\n"
        "Package: mawk\nStatus: install ok installed\nVersion: 1.3.4\nProvides: awk\n"
    )
    offline = index_set(
        "Package: tool\nVersion: 1\nDepends: libc6 (>= 2.34), awk, gone, missing (>= 3) | also-missing\n\n"
        "Package: gone\nVersion: 2\n"
    )
    installs, missing = missing_dependencies(["tool"], status, offline)
    assert installs == ["tool", "gone"]  # the removed package comes from the directory, awk from mawk
    assert [(m.needs, m.by) for m in missing] == [("missing (>= 3) | also-missing", "tool")]
    _installs, missing = missing_dependencies(["absent"], status, offline)
    assert [(m.needs, m.by) for m in missing] == [("absent", "the role")]


@pytest.mark.skipif(not TOOLKIT_DEBS.is_dir(), reason="../shared/fixtures/toolkit-debs is beside the checkout")
def test_the_toolkit_packages_control_files_and_index() -> None:
    index, problems = offline_index(str(TOOLKIT_DEBS))
    assert problems == []
    stanzas = index.split("\n\n")
    assert [s.split("\n", 1)[0] for s in stanzas] == [
        "Package: nvidia-container-toolkit-base",
        "Package: nvidia-container-toolkit",
    ]
    sums = dict(reversed(line.split()) for line in (TOOLKIT_DEBS / "SHA256SUMS").read_text().splitlines())
    for stanza in stanzas:
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
        name = fields["Filename"].removeprefix("./")
        assert fields["SHA256"] == sums[name] and int(fields["Size"]) == (TOOLKIT_DEBS / name).stat().st_size
    # The legacy package needs libnvidia-container-tools, which the directory does not hold (issue 25).
    _installs, missing = missing_dependencies(["nvidia-container-toolkit"], installed_set(""), index_set(index))
    assert {m.needs.split(" ", 1)[0] for m in missing} == {"libnvidia-container-tools", "libc6"}


def test_hostile_files_in_an_offline_directory_are_named_never_opened_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo_1_amd64.deb")
    (tmp_path / "real.txt").write_text("x")
    os.symlink(tmp_path / "real.txt", tmp_path / "link_1_amd64.deb")
    (tmp_path / "-oDPkg::Pre-Invoke::=x_1_amd64.deb").write_bytes(b"!<arch>\n")
    (tmp_path / "notdeb_1_amd64.deb").write_bytes(b"hello")
    (tmp_path / "zst_1_amd64.deb").write_bytes(
        b"!<arch>\ncontrol.tar.zst/0           0     0     100644  4         `\nabcd"
    )
    index, problems = offline_index(str(tmp_path))
    assert index == ""
    text = "\n".join(problems)
    assert "fifo_1_amd64.deb is not a regular file" in text
    assert "link_1_amd64.deb" in text  # O_NOFOLLOW: a link is refused
    assert "-oDPkg::Pre-Invoke::=x_1_amd64.deb: not a package file name" in text
    assert "notdeb_1_amd64.deb is not a Debian package" in text
    assert "compressed in a way Python cannot read (zstd): read it with dpkg-deb" in text
    assert len(problems) == 5
    # A fallback reader is asked only for what Python cannot read.
    asked: list[str] = []

    def control(path: str) -> str:
        asked.append(os.path.basename(path))
        return "Package: zst\nVersion: 1\n"

    index, _problems = offline_index(str(tmp_path), control=control)
    assert asked == ["notdeb_1_amd64.deb", "zst_1_amd64.deb"] and "Package: zst" in index


def test_a_file_over_the_cap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.deb"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(DebError, match="over 1024 bytes"):
        read_regular(str(big), limit=1024)
    with pytest.raises(DebError, match="no ar header"):
        control_fields(b"not an ar archive", "x.deb")


@pytest.mark.parametrize(
    "size",
    [b"-60       ", b"+4        ", b"4 4       ", b"99999     "],
    ids=["negative", "signed", "two numbers", "past the end"],
)
def test_a_broken_ar_member_size_is_refused_not_looped_on(tmp_path: Path, size: bytes) -> None:
    """A negative member size once kept the reader on the same header forever (issue 49)."""
    header = b"control.tar/    0           0     0     100644  " + size + b"`\n"
    (tmp_path / "bad_1_amd64.deb").write_bytes(b"!<arch>\n" + header + b"abcd")
    index, problems = offline_index(str(tmp_path))
    assert index == "" and len(problems) == 1 and "a broken ar member header at byte 8" in problems[0]


def _deb(control: str) -> bytes:
    """A .deb as dpkg-deb builds one: ar with debian-binary, control.tar (uncompressed), data.tar."""
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        body = control.encode()
        info = tarfile.TarInfo("./control")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))

    def member(name: str, data: bytes) -> bytes:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}".encode() + b"`\n"
        return header + data + (b"\n" if len(data) % 2 else b"")

    return (
        b"!<arch>\n"
        + member("debian-binary", b"2.0\n")
        + member("control.tar", raw.getvalue())
        + member("data.tar", b"")
    )


def test_a_package_naming_its_own_file_is_refused_and_never_listed(tmp_path: Path) -> None:
    """A control stanza with its own Filename: once added that path to the files the role copies from the
    controller (issue 49): a hostile package could name any controller file."""
    (tmp_path / "evil_1_amd64.deb").write_bytes(_deb("Package: evil\nVersion: 1\nFilename: ../../etc/shadow\n"))
    (tmp_path / "good_1_amd64.deb").write_bytes(_deb("Package: good\nVersion: 1\n"))
    index, problems = offline_index(str(tmp_path))
    assert problems == [f"{tmp_path}/evil_1_amd64.deb: its control file carries the index's own fields (Filename)"]
    assert [line for line in index.splitlines() if line.startswith("Filename")] == ["Filename: ./good_1_amd64.deb"]


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("../../etc/shadow.rpm", False),
        ("/etc/passwd.rpm", False),
        ("-x.rpm", False),
        ("a\nb.deb", False),
        ("docker-ce-27.1.1-1.el9.x86_64.rpm", True),
        ("docker.io_20.10.24+dfsg1-1_amd64.deb", True),
    ],
)
def test_one_check_of_the_names_copied_to_a_guest(name: str, ok: bool) -> None:
    assert package_file_ok(name) is ok
