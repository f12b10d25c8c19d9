"""The collection's changelog, kept with antsibull-changelog (changelogs/): fragments and
changelog.yaml that lint, releases no newer than the one version (gpuprov/__init__.py's), and
a CHANGELOG.md that is what antsibull-changelog generates from changelog.yaml (run in the
assembled collection: dev/tools/build_collection.py's changelog)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

import gpuprov
from tests.ansible.test_collection import DEPRECATED_PLAYBOOKS, MODULES, PLAYBOOKS, ROLES
from tests.conftest import build_collection_tool

REPO = Path(__file__).resolve().parents[2]
CHANGELOGS = REPO / "changelogs"
ANTSIBULL = Path(sys.executable).with_name("antsibull-changelog")


def antsibull(*args: str) -> str:
    proc = subprocess.run([str(ANTSIBULL), *args], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and not proc.stdout.strip(), f"antsibull-changelog {args}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def releases() -> dict[str, dict]:
    return yaml.safe_load((CHANGELOGS / "changelog.yaml").read_text())["releases"] or {}


def test_the_fragments_and_the_changelog_lint() -> None:
    fragments = [p for p in CHANGELOGS.glob("fragments/*") if p.name != ".keep"]  # .keep: git keeps the folder
    assert sorted(fragments) == sorted(CHANGELOGS.glob("fragments/*.yml")), "fragments are .yml"
    antsibull("lint")
    antsibull("lint-changelog-yaml", "changelogs/changelog.yaml")


def test_no_release_is_newer_than_the_version() -> None:
    newer = [v for v in releases() if version_key(v) > version_key(gpuprov.__version__)]
    assert not newer, f"changelog.yaml releases {newer}, newer than gpuprov/__init__.py's {gpuprov.__version__}"


def test_changelog_md_is_what_antsibull_changelog_generates() -> None:
    if not releases():  # before the first release there is nothing to render, and no CHANGELOG.md
        assert not (REPO / "CHANGELOG.md").exists()
        return
    generated = build_collection_tool().changelog(["generate"])["CHANGELOG.md"]
    assert (REPO / "CHANGELOG.md").read_text() == generated, (
        "CHANGELOG.md is stale: python dev/tools/build_collection.py --changelog-release (or edit changelog.yaml "
        "and regenerate)"
    )


def test_each_deprecated_playbook_name_is_in_the_changelog() -> None:
    said = [
        line
        for doc in [
            *(yaml.safe_load(p.read_text()) for p in CHANGELOGS.glob("fragments/*.yml")),
            *(r.get("changes", {}) for r in releases().values()),
        ]
        for line in doc.get("deprecated_features", [])
    ]
    for old, new in DEPRECATED_PLAYBOOKS.items():
        assert [s for s in said if f"{old}.yml" in s and f"gpuprov.kvm.{new}" in s], (old, said)


def test_every_module_plugin_role_and_playbook_is_in_a_release() -> None:
    """antsibull-changelog lists a module or plugin in the release its version_added names, a role
    or playbook from an ``add object.*`` fragment. Until the version is released, as its release
    would list them (antsibull-changelog release, in a copy of the assembled collection)."""
    data = releases()
    if gpuprov.__version__ not in data:
        out = build_collection_tool().changelog(["release"])["changelogs/changelog.yaml"]
        data = yaml.safe_load(out)["releases"]
    listed = set()
    for release in data.values():
        listed |= {f"module {m['name']}" for m in release.get("modules", [])}
        for group in ("plugins", "objects"):
            listed |= {f"{t} {p['name']}" for t, items in release.get(group, {}).items() for p in items}
    lookups = sorted(p.stem for p in (REPO / "plugins" / "lookup").glob("*.py"))
    expected = {f"module {m}" for m in MODULES} | {f"lookup {p}" for p in lookups} | {f"role {r}" for r in ROLES}
    expected |= {f"playbook {p}" for p in PLAYBOOKS if p not in DEPRECATED_PLAYBOOKS}
    assert expected <= listed, sorted(expected - listed)
