"""Kernel arguments by name in GRUB's defaults file, grubby, and the reboot verdict; and the
untrusted-input boundary of kernel_cmdline (issue #11, category 3): whatever is accepted,
sourcing /etc/default/grub as update-grub does gives back exactly the arguments and runs
nothing; whatever is refused changes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.apply.actions import apply
from gpuprov.facts.boot import BootFacts, gather
from gpuprov.facts.iommu import kernel_param, kernel_split, parse_cmdline
from gpuprov.facts.sysfs import Sysfs
from gpuprov.inputs.kernel_args import MAX_LINE, argument_problem
from gpuprov.plan.host.cmdline import (
    CmdlinePlan,
    CmdlineRequest,
    build_request,
    choose_bootloader,
    edit_args,
    grub_quote,
    grubby_default_args,
    plan_grub,
    plan_grubby,
    plan_kernel_cmdline,
    read_grub_variable,
    reboot_owed,
)
from tests.conftest import tree_digest

GRUB = """# If you change this file, run 'update-grub' afterwards.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="quiet splash intel_iommu=off"
GRUB_CMDLINE_LINUX="console=ttyS0,115200"
"""
IOMMU = CmdlineRequest(add=["intel_iommu=on", "iommu=pt"])
DEFAULT = "GRUB_CMDLINE_LINUX_DEFAULT"
# update-grub runs under /bin/sh (dash on Debian, bash on the RHEL family): source with both.
SHELLS = [s for s in ("sh", "bash") if shutil.which(s)]


def test_edit_keeps_every_other_argument_in_place() -> None:
    assert edit_args(["quiet", "splash", "intel_iommu=off"], ["intel_iommu=on", "iommu=pt"], []) == [
        "quiet",
        "splash",
        "intel_iommu=on",
        "iommu=pt",
    ]
    assert edit_args(["a", "iommu=pt", "b", "iommu=pt"], ["iommu=pt"], []) == ["a", "iommu=pt", "b"]
    assert edit_args(["quiet", "pcie_acs_override=downstream"], [], ["pcie_acs_override"]) == ["quiet"]
    # GRUB's own form of a quoted value is the same argument to the kernel: kept as written
    assert edit_args(['"foo=a b"'], ['foo="a b"'], []) == ['"foo=a b"']
    assert edit_args(['foo="a b"', "x"], [], ["foo"]) == ["x"]


def test_grub_plan_changes_only_the_variable() -> None:
    plan = plan_grub(GRUB, "BOOT_IMAGE=/vmlinuz quiet splash", IOMMU, ["update-grub"])
    new = plan.actions[0].content or ""
    assert new == GRUB.replace('"quiet splash intel_iommu=off"', '"quiet splash intel_iommu=on iommu=pt"')
    assert plan.describe()[1] == "run update-grub (regenerate the GRUB menu)"
    assert plan.reboot_required
    assert plan.diff()[0]["before"] == GRUB


def test_grub_plan_is_idempotent_and_knows_when_no_reboot_is_owed() -> None:
    first = plan_grub(GRUB, "quiet", IOMMU, ["update-grub"]).actions[0].content
    again = plan_grub(first, "BOOT_IMAGE=/vmlinuz quiet splash intel_iommu=on iommu=pt", IOMMU, ["update-grub"])
    assert again.actions == [] and not again.reboot_required


def test_missing_variable_is_appended_and_single_quotes_kept() -> None:
    plan = plan_grub("GRUB_TIMEOUT=5\n", "", IOMMU, ["update-grub"])
    assert plan.actions[0].content == 'GRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="intel_iommu=on iommu=pt"\n'
    quoted = plan_grub("GRUB_CMDLINE_LINUX_DEFAULT='quiet'\n", "", IOMMU, ["update-grub"])
    assert quoted.actions[0].content == "GRUB_CMDLINE_LINUX_DEFAULT='quiet intel_iommu=on iommu=pt'\n"


def test_a_quoted_value_is_written_single_quoted_and_read_back() -> None:
    request = CmdlineRequest(add=['acpi_osi="Windows 2015"'])
    plan = plan_grub(GRUB, "", request, ["update-grub"])
    assert "GRUB_CMDLINE_LINUX_DEFAULT='quiet splash intel_iommu=off acpi_osi=\"Windows 2015\"'\n" in (
        plan.actions[0].content or ""
    )
    assert read_grub_variable(plan.actions[0].content or "", DEFAULT).args[-1] == 'acpi_osi="Windows 2015"'
    # the escaped form people write in the distribution's double quotes is read too
    escaped = 'GRUB_CMDLINE_LINUX_DEFAULT="quiet acpi_osi=\\"Windows 2015\\""\n'
    assert read_grub_variable(escaped, DEFAULT).args == ["quiet", 'acpi_osi="Windows 2015"']
    assert plan_grub(escaped, "", request, ["update-grub"]).actions == []
    # GRUB hands the kernel "acpi_osi=Windows 2015": the reboot verdict reads it as the same argument
    assert not reboot_owed('BOOT_IMAGE=/vmlinuz "acpi_osi=Windows 2015" quiet', request)
    assert reboot_owed("acpi_osi=Windows", request)


def test_debians_own_defaults_file_is_edited() -> None:
    debian = (Path(__file__).parents[2] / "molecule/_shared/files/grub.default").read_text()
    plan = plan_grub(debian, "", IOMMU, ["update-grub"])
    assert plan.actions[0].content == debian.replace('DEFAULT="quiet"', 'DEFAULT="quiet intel_iommu=on iommu=pt"')


def test_no_grub_defaults_file_is_refused() -> None:
    plan = plan_grub(None, "", IOMMU, ["update-grub"])
    assert "/etc/default/grub does not exist" in plan.refusal_text() and "grubby" in plan.refusal_text()


def test_a_dropin_that_names_the_variable_is_a_warning() -> None:
    dropins = {"50-cloudimg-settings.cfg": 'GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0"\n', "x.cfg": "GRUB_TIMEOUT=0\n"}
    plan = plan_grub(GRUB, "", IOMMU, ["update-grub"], dropins)
    assert plan.warnings == [
        "/etc/default/grub.d/50-cloudimg-settings.cfg also names GRUB_CMDLINE_LINUX_DEFAULT; update-grub reads "
        "it after /etc/default/grub, so it may override this edit"
    ]


def test_grubby_plan() -> None:
    plan = plan_grubby(
        "ro crashkernel=auto intel_iommu=off rhgb", "ro", CmdlineRequest(add=["intel_iommu=on"], remove=["rhgb"])
    )
    assert plan.describe() == [
        "run grubby --update-kernel=ALL --args=intel_iommu=on (kernel arguments for every entry)",
        "run grubby --update-kernel=ALL --remove-args=rhgb (drop kernel arguments)",
    ]
    assert plan.args_after == "ro crashkernel=auto intel_iommu=on"
    quoted = CmdlineRequest(add=['foo="a b"'])
    assert plan_grubby('ro foo="a b"', "", quoted).actions == []
    assert plan_grubby("ro", "", quoted).actions[0].argv == ["grubby", "--update-kernel=ALL", '--args=foo="a b"']


def test_grubby_info_args_lose_one_pair_of_quotes() -> None:
    assert (
        grubby_default_args('index=0\nkernel="/boot/vmlinuz"\nargs="ro foo=\\"x\\" quiet"\n') == 'ro foo=\\"x\\" quiet'
    )
    assert grubby_default_args('args="ro foo="a b""\n') == 'ro foo="a b"'
    assert grubby_default_args("kernel=x\n") is None


def test_boot_facts_find_grubs_tools_under_the_root(tmp_path: Path) -> None:
    for rel in ("usr/sbin/grub2-mkconfig", "usr/sbin/grubby", "etc/default/grub.d/x.cfg", "etc/default/grub.d/y"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("X=1\n")
    (tmp_path / "boot/grub2").mkdir(parents=True)
    (tmp_path / "etc/default/grub").write_text(GRUB)
    facts = gather(Sysfs(str(tmp_path)))
    assert facts.update_argv == ["grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"]
    assert facts.has_grubby and facts.grubby_info is None  # grubby is asked on the live root only
    assert facts.dropins == {"x.cfg": "X=1\n"} and facts.grub_default == GRUB.encode()
    assert choose_bootloader("auto", facts) == "grub"  # grubby only on the live root
    (tmp_path / "usr/sbin/update-grub").write_text("")
    assert gather(Sysfs(str(tmp_path))).update_argv == ["update-grub"]


def test_kernel_cmdline_plan_picks_the_bootloader_and_refuses_what_it_cannot_do() -> None:
    grubby = BootFacts(live=True, has_grubby=True, grubby_info=(0, 'args="ro quiet"\n', ""))
    assert choose_bootloader("auto", grubby) == "grubby"
    assert plan_kernel_cmdline(grubby, IOMMU, "grubby", True).actions[0].argv == [
        "grubby",
        "--update-kernel=ALL",
        "--args=intel_iommu=on iommu=pt",
    ]
    failed = BootFacts(live=True, has_grubby=True, grubby_info=(1, "", "no default\n"))
    assert "gave no args= line (rc 1): no default" in plan_kernel_cmdline(failed, IOMMU, "grubby", True).refusal_text()
    assert "live root only" in plan_kernel_cmdline(BootFacts(live=False), IOMMU, "grubby", True).refusal_text()
    no_tool = BootFacts(live=True, grub_default=GRUB.encode())
    assert "no update-grub or grub2-mkconfig" in plan_kernel_cmdline(no_tool, IOMMU, "grub", True).refusal_text()
    assert [a.kind for a in plan_kernel_cmdline(no_tool, IOMMU, "grub", False).actions] == ["file"]
    staged = BootFacts(live=False, grub_default=GRUB.encode(), update_argv=["grub2-mkconfig", "-o", "/boot/g.cfg"])
    assert plan_kernel_cmdline(staged, IOMMU, "grub", True).actions[1].argv == ["grub2-mkconfig", "-o", "/boot/g.cfg"]
    unreadable = BootFacts(live=False, grub_default_unreadable=True)
    assert "cannot be read" in plan_kernel_cmdline(unreadable, IOMMU, "grub", True).refusal_text()


@pytest.mark.parametrize("bad", ["intel iommu", "=on", "a;b=1", "-s", ".x"])
def test_bad_argument_names(bad: str) -> None:
    problem = argument_problem(bad)
    assert problem is not None and problem[1]


def test_reboot_owed_for_removed_args_too() -> None:
    assert reboot_owed("quiet pcie_acs_override=downstream", CmdlineRequest(remove=["pcie_acs_override"]))
    assert not reboot_owed("quiet", CmdlineRequest(remove=["pcie_acs_override"]))


def test_the_kernel_split() -> None:
    """lib/cmdline.c next_arg: spaces split except inside double quotes; quotes come off the value."""
    assert kernel_split(' a="b c"  "d=e f" g\th\n') == ['a="b c"', '"d=e f"', "g", "h"]
    assert [kernel_param(t) for t in kernel_split('a="b c" "d=e f" g a=b=c')] == [
        ("a", "b c"),
        ("d", "e f"),
        ("g", None),
        ("a", "b=c"),
    ]
    assert parse_cmdline('x=1 foo="a b" x=2') == {"x": "2", "foo": "a b"}


# -- the boundary: every hostile option or file, applied to a staged root, then sourced ---------


def stage(tmp_path: Path, grub: str | bytes = GRUB) -> Path:
    root = tmp_path / "root"
    (root / "etc/default").mkdir(parents=True)
    path = root / "etc/default/grub"
    path.write_bytes(grub.encode() if isinstance(grub, str) else grub)
    return root


def kernel_cmdline(
    root: Path, arguments: list[str], remove: list[str] | None = None, variable: str = DEFAULT
) -> CmdlinePlan:
    """What the module does with its options, in-process: check, plan against the root, apply."""
    request, refusals = build_request(arguments, remove or [], variable)
    if refusals:
        return CmdlinePlan(refusals=refusals)
    plan = plan_grub((root / "etc/default/grub").read_bytes(), "", request, ["update-grub"])
    if not plan.refused:
        apply(plan, str(root))
    return plan


def sourced(tmp_path: Path, root: Path, variable: str = DEFAULT, check: bool = True) -> list[str] | None:
    """The variable as update-grub gets it (``. /etc/default/grub``), in each shell; one answer.
    ``check=False``: None when a shell cannot source the file (update-grub would stop there)."""
    values = set()
    for shell in SHELLS:
        out = subprocess.run(
            [shell, "-c", f'. "$1"; printf %s "${{{variable}}}"', "sh", str(root / "etc/default/grub")],
            cwd=tmp_path,
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        if out.returncode != 0:
            assert not check, out.stderr
            return None
        values.add(out.stdout)
    assert len(values) == 1, values
    return kernel_split(values.pop())


ORIGINAL = ["quiet", "splash", "intel_iommu=off"]
# (id, arguments, remove, variable, refusal text or None) -- CANARY: a path a payload would create.
HOSTILE_OPTIONS = [
    ("command-substitution", ["foo=$(touch CANARY)"], [], DEFAULT, "holds $ at position 4"),
    ("quoted-substitution", ['foo="$(touch CANARY)"'], [], DEFAULT, "holds $ at position 5"),
    ("backticks", ["foo=`touch CANARY`"], [], DEFAULT, "holds ` at position 4"),
    ("variable", ["foo=$HOME"], [], DEFAULT, "holds $"),
    ("backslash", ["foo=a\\b"], [], DEFAULT, "holds \\ at position 5"),
    ("single-quote", ["a'b"], [], DEFAULT, "holds ' at position 1"),
    ("single-quote-breakout", ["x='; touch CANARY; '"], [], DEFAULT, "holds ' at position 2"),
    ("newline", ["foo=a\nGRUB_X=$(touch CANARY)"], [], DEFAULT, "control character '\\n'"),
    ("carriage-return", ["foo=a\rb"], [], DEFAULT, "control character '\\r'"),
    ("nul", ["foo=a\0b"], [], DEFAULT, "control character '\\x00'"),
    ("tab", ["foo=a\tb"], [], DEFAULT, "control character '\\t'"),
    ("delete", ["foo=a\x7fb"], [], DEFAULT, "control character '\\x7f'"),
    ("unbalanced-quote", ['foo="a b'], [], DEFAULT, "double quote outside the one quoted form"),
    ("quote-inside", ['foo="a"b"'], [], DEFAULT, "double quote outside the one quoted form"),
    ("grub-whole-quoted-form", ['"foo=a b"'], [], DEFAULT, "not a kernel parameter name"),
    ("too-long", ["foo=" + "x" * 3000], [], DEFAULT, "is 3004 characters long"),
    ("two-arguments", ["foo=a b"], [], DEFAULT, "is 2 kernel arguments, not one"),
    ("leading-space", [" quiet"], [], DEFAULT, "is 1 kernel arguments, not one"),
    ("empty", [""], [], DEFAULT, "is empty"),
    ("grub-separator", ["foo=a;reboot"], [], DEFAULT, "has ';' in an unquoted value"),
    ("grub-block", ["foo={x}"], [], DEFAULT, "has '{' in an unquoted value"),
    ("grub-comment", ["foo=#x"], [], DEFAULT, "has '#' in an unquoted value"),
    ("grub-wildcard", ["foo=*"], [], DEFAULT, "has '*' in an unquoted value"),
    ("init-separator", ["--"], [], DEFAULT, "not a kernel parameter name"),
    ("latin1-nbsp", ["foo=a\xa0b"], [], DEFAULT, "non-ASCII character '\\xa0'"),
    ("utf8-letter", ["foo=caf\xe9"], [], DEFAULT, "non-ASCII character '\\xe9'"),
    ("bidi-override", ["foo=\u202eevil"], [], DEFAULT, "non-ASCII character '\\u202e'"),
    ("fullwidth-name", ["\uff46oo=1"], [], DEFAULT, "non-ASCII character '\\uff46'"),
    ("zero-width-space", ["foo=a\u200bb"], [], DEFAULT, "non-ASCII character '\\u200b'"),
    ("variable-newline", ["quiet"], [], "FOO\nrm -rf /", "variable 'FOO\\nrm -rf /' is not a GRUB kernel"),
    ("variable-path", ["quiet"], [], "PATH", "variable 'PATH' is not a GRUB kernel command-line variable"),
    ("variable-recovery", ["quiet"], [], "GRUB_CMDLINE_LINUX_RECOVERY", "is not a GRUB kernel"),
    ("variable-assignment", ["quiet"], [], "GRUB_CMDLINE_LINUX=$(touch CANARY)", "is not a GRUB kernel"),
    ("remove-substitution", [], ["$(touch CANARY)"], DEFAULT, "remove: '$(touch "),
    ("add-and-remove", ["iommu=pt"], ["iommu"], DEFAULT, "iommu is both in arguments and in remove"),
    ("given-twice", ["iommu=pt", "iommu=off"], [], DEFAULT, "iommu is given twice"),
]
# Accepted, though they look hostile: one argument each, written so that nothing expands.
SAFE_OPTIONS = [
    ("quoted-shell-syntax", ['x="; touch CANARY; y="'], [], DEFAULT, None),
    ("quoted-grub-syntax", ['foo="a;b|c&d<e>f{g}#h*?[i]"'], [], DEFAULT, None),
    ("quoted-spaces", ['acpi_osi="Windows 2015"'], [], DEFAULT, None),
    ("empty-values", ["foo=", 'bar=""'], [], DEFAULT, None),
    ("remove-by-name=value", [], ["splash=whatever"], DEFAULT, None),
]


@pytest.mark.parametrize(
    ("arguments", "remove", "variable", "refusal"),
    [pytest.param(*case[1:], id=case[0]) for case in HOSTILE_OPTIONS + SAFE_OPTIONS],
)
def test_hostile_options_are_refused_or_written_so_nothing_runs(
    tmp_path: Path, arguments: list[str], remove: list[str], variable: str, refusal: str | None
) -> None:
    root = stage(tmp_path)
    canary = tmp_path / "canary"

    def fill(items: list[str]) -> list[str]:
        return [item.replace("CANARY", str(canary)) for item in items]

    before = tree_digest(root)
    plan = kernel_cmdline(root, fill(arguments), fill(remove), variable.replace("CANARY", str(canary)))
    if refusal:
        text = plan.refusal_text()
        assert plan.refused and refusal in text and "; fix: " in text, text
        assert tree_digest(root) == before
        assert sourced(tmp_path, root) == ORIGINAL
    else:
        assert not plan.refused, plan.refusal_text()
        wanted = edit_args(ORIGINAL, fill(arguments), [kernel_param(r)[0] for r in remove])
        assert sourced(tmp_path, root) == wanted
        written = (root / "etc/default/grub").read_bytes()
        assert kernel_cmdline(root, fill(arguments), fill(remove)).actions == []  # idempotent
        assert (root / "etc/default/grub").read_bytes() == written
    assert not canary.exists()


# (id, the existing file): each is refused, unchanged, and the module never sources it.
PAYLOAD = "$(touch CANARY)"
HOSTILE_FILES = [
    ("substitution-in-line", f'GRUB_CMDLINE_LINUX_DEFAULT="quiet {PAYLOAD}"\n'),
    ("backticks-in-line", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet `touch CANARY`"\n'),
    ("unquoted-substitution", f"GRUB_CMDLINE_LINUX_DEFAULT={PAYLOAD}\n"),
    ("variable-in-line", 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX quiet"\n'),
    ("escaped-dollar", 'GRUB_CMDLINE_LINUX_DEFAULT="memmap=2G\\$4G"\n'),
    ("command-after", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"; touch CANARY\n'),
    ("glued-comment", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"#c\n'),
    ("continuation", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet \\\nsplash"\n'),
    ("multi-line-value", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet\nsplash"\n'),
    ("append", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX_DEFAULT+=" splash"\n'),
    ("duplicate", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX_DEFAULT="splash"\n'),
    ("eval", f'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\neval "$GRUB_CMDLINE_LINUX_DEFAULT {PAYLOAD}"\n'),
    ("inside-another-string", "X='\nGRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\n'\n"),
    ("unterminated-quote", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nX="oops\n'),
    ("here-document", 'cat >/dev/null <<EOF\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nEOF\n'),
    ("ansi-c-quoting", "X=$'\\''\nGRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\n"),
    ("stray-paren", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n)\n'),
    ("crlf", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\r\n'),
    ("nul-byte", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n\0\n'),
    ("not-utf8", b'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n# caf\xe9\n'),
    ("readonly", 'readonly GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'),
    ("unsafe-argument-already-there", "GRUB_CMDLINE_LINUX_DEFAULT=\"quiet foo='a'\"\n"),
]


@pytest.mark.parametrize("grub", [pytest.param(case[1], id=case[0]) for case in HOSTILE_FILES])
def test_an_unsafe_existing_file_is_refused_unchanged(tmp_path: Path, grub: str | bytes) -> None:
    canary = tmp_path / "canary"
    root = stage(tmp_path, grub.replace("CANARY", str(canary)) if isinstance(grub, str) else grub)
    before = tree_digest(root)
    plan = kernel_cmdline(root, ["intel_iommu=on"])
    text = plan.refusal_text()
    assert plan.refused and "cannot" in text and "; fix: " in text, text
    assert tree_digest(root) == before and not canary.exists()


def test_an_export_and_a_trailing_comment_are_kept(tmp_path: Path) -> None:
    root = stage(tmp_path, "export GRUB_CMDLINE_LINUX_DEFAULT=quiet  # the default\n")
    kernel_cmdline(root, ["iommu=pt"])
    text = (root / "etc/default/grub").read_text()
    assert text == 'export GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"  # the default\n'
    assert sourced(tmp_path, root) == ["quiet", "iommu=pt"]


def test_the_whole_line_is_bounded(tmp_path: Path) -> None:
    root = stage(tmp_path)
    before = tree_digest(root)
    plan = kernel_cmdline(root, [f"a{i}=" + "x" * 200 for i in range(10)])
    assert plan.refused and f"the kernel's command line holds at most {MAX_LINE}" in plan.refusal_text()
    assert tree_digest(root) == before


# -- properties -------------------------------------------------------------------------------

# The documented alphabets (docs/reference/kernel-cmdline.md), written out here on purpose.
NAME_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
BARE = NAME_START + ".-,:=/+@%!~^()"
QUOTED = BARE + " ;|&<>{}#*?[]"
names = st.text(NAME_START, min_size=1, max_size=1).flatmap(
    lambda first: st.text(NAME_START + ".-", max_size=12).map(lambda rest: first + rest)
)
values = st.one_of(
    st.none(),
    st.text(BARE, max_size=16).map(lambda v: f"={v}"),
    st.text(QUOTED, max_size=16).map(lambda v: f'="{v}"'),
)
valid_arguments = st.lists(
    st.tuples(names, values).map(lambda nv: nv[0] + (nv[1] or "")),
    min_size=1,
    max_size=6,
    unique_by=lambda a: kernel_param(a)[0],
)
BASES = [
    GRUB,
    "GRUB_CMDLINE_LINUX_DEFAULT='quiet'\n",
    "GRUB_TIMEOUT=5",
    'export GRUB_CMDLINE_LINUX_DEFAULT="quiet acpi_osi=\\"Windows 2015\\"" # escaped\n',
    "GRUB_CMDLINE_LINUX_DEFAULT=\n",
]


@given(arguments=valid_arguments, base=st.sampled_from(BASES))
def test_every_valid_argument_round_trips_is_idempotent_and_removable(
    tmp_path_factory: pytest.TempPathFactory, arguments: list[str], base: str
) -> None:
    tmp_path = tmp_path_factory.mktemp("prop")
    assert all(argument_problem(a) is None for a in arguments)
    assert kernel_split(" ".join(arguments)) == arguments  # each is exactly one kernel argument
    root = stage(tmp_path, base)
    original = read_grub_variable(base, DEFAULT).args
    wanted = edit_args(original, arguments, [])
    assert not kernel_cmdline(root, arguments).refused
    written = (root / "etc/default/grub").read_bytes()
    assert read_grub_variable(written.decode(), DEFAULT).args == wanted  # parse(write(x)) == x
    assert sourced(tmp_path, root) == wanted
    assert kernel_cmdline(root, arguments).actions == []
    assert (root / "etc/default/grub").read_bytes() == written
    names_ = [kernel_param(a)[0] for a in arguments]
    kernel_cmdline(root, [], names_)
    assert sourced(tmp_path, root) == [a for a in original if kernel_param(a)[0] not in names_]


@given(arguments=valid_arguments, quote=st.sampled_from(['"', "'"]))
def test_the_written_form_parses_back(arguments: list[str], quote: str) -> None:
    text = f"{DEFAULT}={grub_quote(arguments, quote)}\n"
    assert read_grub_variable(text, DEFAULT).args == arguments


NASTY = [*" \"'$`\\;|&<>{}#*?[]()=\n\r\t\0\x7f\xa0\xe9\u202e", "$(touch CANARY)", "foo", "=", '="', "a b"]


@given(pieces=st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=3)), max_size=8))
def test_any_text_is_refused_unchanged_or_sourced_back_exactly(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[str]
) -> None:
    tmp_path = tmp_path_factory.mktemp("nasty")
    canary = tmp_path / "canary"
    argument = "".join(pieces).replace("CANARY", str(canary))
    root = stage(tmp_path)
    before = tree_digest(root)
    plan = kernel_cmdline(root, [argument])
    if argument_problem(argument):
        assert plan.refused and tree_digest(root) == before
        assert sourced(tmp_path, root) == ORIGINAL
    else:
        assert sourced(tmp_path, root) == edit_args(ORIGINAL, [argument], [])
    assert not canary.exists()


SHELLISH = st.lists(
    st.sampled_from([*"\"'`$\\(){}; #=\n\tx", "GRUB_CMDLINE_LINUX_DEFAULT=", "x=", "<<", "quiet", "a b"]), max_size=12
).map("".join)


@given(
    head=SHELLISH,
    rhs=st.one_of(SHELLISH, SHELLISH.map(lambda s: f'"{s}"'), SHELLISH.map(lambda s: f"'{s}'")),
    tail=SHELLISH,
)
def test_a_file_that_parses_is_read_as_the_shell_reads_it(
    tmp_path_factory: pytest.TempPathFactory, head: str, rhs: str, tail: str
) -> None:
    """Random shell around an assignment: where gpuprov reads the variable, the shell agrees
    (sourced in a temp dir: the alphabet names no command but x, which does not exist)."""
    text = f"{head}\nGRUB_CMDLINE_LINUX_DEFAULT={rhs}\n{tail}\n"
    try:
        parsed = read_grub_variable(text, DEFAULT)
    except ValueError:
        return
    tmp_path = tmp_path_factory.mktemp("shellish")
    root = stage(tmp_path, text)
    shell_args = sourced(tmp_path, root, check=False)
    if shell_args is None:
        return  # not valid shell at all: update-grub stops before using anything
    assert shell_args == parsed.args
    # and what gpuprov writes into it is sourced back exactly
    plan = kernel_cmdline(root, ["iommu=pt"])
    if not plan.refused:
        assert sourced(tmp_path, root) == edit_args(parsed.args, ["iommu=pt"], [])
