"""Archive components on a guest's apt sources (gpuprov.guest.aptsources, the
guest_nvidia_driver role's apt_components module): the stock files of Debian 12
and Ubuntu 24.04 in both formats, third-party entries left alone, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.apply.actions import apply
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.guest.aptsources import edit_deb822, edit_one_line, plan_components
from tests.conftest import tree_digest
from tests.modules.test_modules import bare_python as bare_python  # a fixture: re-exported for pytest
from tests.modules.test_modules import run_module

DEBIAN = ["contrib", "non-free", "non-free-firmware"]

# Debian 12's stock deb822 file (a cloud image's, with a comment inside a stanza).
DEBIAN_SOURCES = """\
Types: deb deb-src
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

SOURCES_LIST = """\
# deb cdrom:[Debian GNU/Linux 12.5.0 _Bookworm_]/ bookworm main
deb http://deb.debian.org/debian bookworm main
deb-src http://deb.debian.org/debian bookworm main non-free
deb http://security.debian.org/debian-security bookworm-security main  # security updates
deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.gpg] https://download.docker.com/linux/debian bookworm stable
deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
deb [signed-by=/usr/share/keyrings/nodesource.gpg] https://deb.nodesource.com/node_20.x nodistro main
"""


def test_debian_deb822_gets_contrib_non_free_and_firmware() -> None:
    new, entries = edit_deb822(DEBIAN_SOURCES, "etc/apt/sources.list.d/debian.sources", "bookworm", DEBIAN)
    assert new == DEBIAN_SOURCES.replace("Components: main\n", "Components: main contrib non-free non-free-firmware\n")
    assert [(e.suites, e.added) for e in entries] == [
        (["bookworm", "bookworm-updates"], DEBIAN),
        (["bookworm-security"], DEBIAN),
    ]
    again, entries = edit_deb822(new, "x.sources", "bookworm", DEBIAN)
    assert again == new and all(e.added == [] for e in entries)


def test_one_line_entries_of_the_release_only() -> None:
    new, entries = edit_one_line(SOURCES_LIST, "etc/apt/sources.list", "bookworm", DEBIAN)
    lines = new.splitlines()
    assert lines[0] == "# deb cdrom:[Debian GNU/Linux 12.5.0 _Bookworm_]/ bookworm main"  # a comment stays one
    assert lines[1] == "deb http://deb.debian.org/debian bookworm main contrib non-free non-free-firmware"
    assert lines[2] == "deb-src http://deb.debian.org/debian bookworm main non-free contrib non-free-firmware"
    assert lines[3] == (
        "deb http://security.debian.org/debian-security bookworm-security main contrib non-free non-free-firmware "
        "# security updates"
    )
    # Docker's (no main), Google's (cloud-sdk-bookworm is not a bookworm suite), NodeSource's: untouched.
    assert lines[4:] == SOURCES_LIST.splitlines()[4:]
    assert [e.added for e in entries] == [DEBIAN, ["contrib", "non-free-firmware"], DEBIAN]
    assert edit_one_line(new, "x.list", "bookworm", DEBIAN)[0] == new


def test_ubuntu_gets_restricted() -> None:
    text = (
        "Types: deb\nURIs: http://archive.ubuntu.com/ubuntu/\nSuites: noble noble-updates noble-backports\n"
        "Components: main universe\nSigned-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n"
    )
    new, (entry,) = edit_deb822(text, "etc/apt/sources.list.d/ubuntu.sources", "noble", ["restricted"])
    assert "Components: main universe restricted\n" in new and entry.added == ["restricted"]


def test_disabled_mixed_and_folded_stanzas() -> None:
    text = (
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm stable\nComponents: main\n\n"
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n contrib\n"
    )
    new, entries = edit_deb822(text, "x.sources", "bookworm", DEBIAN)
    stanzas = new.split("\n\n")
    assert stanzas[:2] == text.split("\n\n")[:2]  # disabled; a suite that is not the release's
    assert stanzas[2] == (
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n"
        "Components: main contrib non-free non-free-firmware\n"
    )
    assert [e.components for e in entries] == [["main", "contrib"]]


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_plan_edits_both_formats_and_applies_once(tmp_path) -> None:
    root = write(
        tmp_path,
        {
            "etc/apt/sources.list": "# moved to sources.list.d\n",
            "etc/apt/sources.list.d/debian.sources": DEBIAN_SOURCES,
            "etc/apt/sources.list.d/extra.list": "deb http://deb.debian.org/debian bookworm-backports main\n",
            "etc/apt/sources.list.d/notes.txt": "deb http://deb.debian.org/debian bookworm main\n",
        },
    )
    plan, entries = plan_components(Sysfs(str(root)), "bookworm", DEBIAN)
    assert not plan.refused
    assert [a.path for a in plan.actions] == [
        "etc/apt/sources.list.d/debian.sources",
        "etc/apt/sources.list.d/extra.list",
    ]
    assert len(entries) == 3
    apply(plan, str(root))
    assert (root / "etc/apt/sources.list.d/extra.list").read_text() == (
        "deb http://deb.debian.org/debian bookworm-backports main contrib non-free non-free-firmware\n"
    )
    assert (root / "etc/apt/sources.list.d/notes.txt").read_text().endswith("bookworm main\n")  # apt ignores .txt
    again, _ = plan_components(Sysfs(str(root)), "bookworm", DEBIAN)
    assert again.actions == [] and not again.refused


@pytest.mark.parametrize(
    ("files", "codename", "components", "text"),
    [
        ({"etc/apt/sources.list": "deb http://deb.debian.org/debian bullseye main\n"}, "bookworm", DEBIAN,
         "no apt entry for bookworm with the main component in /etc/apt/sources.list"),
        ({}, "bookworm", DEBIAN, "(read: no source files)"),
        ({"etc/apt/sources.list": SOURCES_LIST}, "book worm", DEBIAN, "'book worm' is not a release codename"),
        ({"etc/apt/sources.list": SOURCES_LIST}, "bookworm", ["non free"], "'non free' is not an archive component"),
    ],
)  # fmt: skip
def test_refusals_change_nothing(tmp_path, files, codename, components, text) -> None:
    root = write(tmp_path, files)
    plan, _ = plan_components(Sysfs(str(root)), codename, components)
    assert plan.refused and text in plan.refusal_text()
    assert plan.actions == []


def test_the_module_check_mode_diff_apply_idempotent(bare_python, tmp_path) -> None:
    root = write(tmp_path / "guest", {"etc/apt/sources.list.d/debian.sources": DEBIAN_SOURCES})
    args = {"codename": "bookworm", "components": DEBIAN, "root": str(root)}
    before = tree_digest(root)
    dry = run_module(bare_python, "apt_components", args, check=True)
    assert dry["changed"] is True and not dry["failed"] and tree_digest(root) == before
    assert "+Components: main contrib non-free non-free-firmware" in dry["stdout"]
    first = run_module(bare_python, "apt_components", args)
    assert first["changed"] is True
    assert [e["added"] for e in first["entries"]] == [DEBIAN, DEBIAN]
    assert first["entries"][0]["path"] == "/etc/apt/sources.list.d/debian.sources"
    assert run_module(bare_python, "apt_components", args)["changed"] is False


def test_the_module_refuses_and_changes_nothing(bare_python, tmp_path) -> None:
    root = write(tmp_path / "guest", {"etc/apt/sources.list": "deb http://deb.debian.org/debian bullseye main\n"})
    before = tree_digest(root)
    result = run_module(
        bare_python, "apt_components", {"codename": "bookworm", "components": DEBIAN, "root": str(root)}
    )
    assert result["failed"] is True and result["msg"].startswith("refused, nothing changed: no apt entry for bookworm")
    assert tree_digest(root) == before
