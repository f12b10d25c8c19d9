"""Hostile boot input (issue 26, items 2 and 3): the trial record /var/lib/gpuprov/boot-trial.json,
grub.cfg, grubenv, custom.cfg, /etc/default/grub and /proc/cmdline, read by iommu_boot and
kernel_cmdline. Invariants: no exception escapes a reader, planner or module; a record that does
not parse or fails its schema is unknown, named with its path, and never committed on; a file
larger than gpuprov reads is refused naming it, the root unchanged; every parser is linear (a
grub.cfg padded with 100,000 blank lines reads in a fraction of a second: the old regex took
minutes).

The staged host is tests/plan/test_boot_trial.py's Debian 12 GRUB host; reboots are played the same way.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprov.core.plan import REMOVE_FILE
from gpuprov.facts.bootloader import (
    GRUB_CFG,
    GRUB_ENV,
    MAX_GRUB_CFG,
    MAX_STATE,
    TRIAL_STATE,
    TRIAL_UP,
    check_state,
    gather_boot_inputs,
    parse_state,
)
from gpuprov.facts.boundedjson import json_depth
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.host.boot_trial import (
    CUSTOM_BEGIN,
    CUSTOM_END,
    MARK_BEGIN,
    MARK_END,
    BootRequest,
    _block,
    custom_cfg,
    grub_default_entry,
    grub_menuentries,
    grub_trial_entry,
    plan_boot,
)
from gpuprov.plan.host.cmdline import MAX_GRUB_DEFAULT
from tests.conftest import tree_digest
from tests.modrun import run_in_process
from tests.plan.test_boot_trial import GRUB_CFG as CFG
from tests.plan.test_boot_trial import KVER, LINE, applied, debian, plan, reboot, trial_line

STATE_PATH = f"/{TRIAL_STATE}"
DEFAULT_LINE = f"BOOT_IMAGE=/boot/vmlinuz-{KVER} {LINE}"
# Work bound for the linear readers: CPU seconds (not wall time: a loaded machine does not stretch
# them much), about 100 times what they take; the quadratic regexes they replace took minutes.
CPU_BUDGET = 10.0


def module(root: Path, **args: Any) -> dict[str, Any]:
    return run_in_process("iommu_boot", {"root": str(root), "reboot_allowed": True, **args}, check=True)


def armed_record(root: Path) -> dict[str, Any]:
    """Arm a trial on the staged host; its record as gpuprov wrote it."""
    applied(root, plan(root))
    return json.loads((root / TRIAL_STATE).read_text())


def put_record(root: Path, text: str | bytes) -> None:
    path = root / TRIAL_STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)


# -- the trial record: explicit regressions ------------------------------------------------------

# (name, a change of the armed record's JSON text) -> each crashed iommu_boot before (issue 26, item 3).
HOSTILE_RECORDS = {
    "unconfirmed-text": lambda r: json.dumps({**r, "unconfirmed": "x"}),
    "unconfirmed-inf": lambda r: json.dumps({**r, "unconfirmed": 0}).replace(
        '"unconfirmed": 0', '"unconfirmed": 1e999'
    ),
    "unconfirmed-list": lambda r: json.dumps({**r, "unconfirmed": [1]}),
    "unconfirmed-superscript": lambda r: json.dumps({**r, "unconfirmed": "\u00b2"}),  # isdigit, not int()
    "unconfirmed-huge": lambda r: json.dumps({**r}).replace('"unconfirmed": 0', '"unconfirmed": ' + "9" * 5000),
    "unconfirmed-bool": lambda r: json.dumps({**r, "unconfirmed": True}),
    "unconfirmed-negative": lambda r: json.dumps({**r, "unconfirmed": -1}),
    "nan": lambda r: json.dumps({**r}).replace('"unconfirmed": 0', '"unconfirmed": NaN'),
    "args-before-object": lambda r: json.dumps({**r, "args_before": {"a": 1}, "status": "failed"}),
    "why-object": lambda r: json.dumps({**r, "why": {"a": 1}, "status": "failed"}),
    "added-numbers": lambda r: json.dumps({**r, "added": [1, 2]}),
    "trial-initrd-list": lambda r: json.dumps({**r, "trial_initrd": ["boot/x.gpuprov-trial"]}),
    "watchdog-script": lambda r: json.dumps({**r, "watchdog": "x;reboot"}),
    "id-number": lambda r: json.dumps({**r, "id": 5}),
    "status-unknown": lambda r: json.dumps({**r, "status": "committed"}),
    "top-level-list": lambda r: json.dumps([r]),
    "deep-arrays": lambda r: "[" * 20000 + "]" * 20000,
    "deep-objects": lambda r: '{"a":' * 20000 + "1" + "}" * 20000,
    "deep-in-field": lambda r: json.dumps({**r, "added": [[[[[["x"]]]]]]}),
    "huge": lambda r: json.dumps(r) + " " * MAX_STATE,
    "not-utf8": lambda r: json.dumps(r).encode() + b"\xff",
    "not-json": lambda r: "[not a record",
    "empty": lambda r: "",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_RECORDS))
@pytest.mark.parametrize("when", ["same-boot", "trial-boot", "came-back-unchecked", "came-back"])
def test_a_hostile_trial_record_is_unknown_never_a_traceback(tmp_path: Path, name: str, when: str) -> None:
    """Each broken record, at each point of the flow: the module answers (no exception), names
    the record's path, uses nothing in it, and never commits the default on it."""
    debian(tmp_path)
    record = armed_record(tmp_path)
    if when == "trial-boot":
        reboot(tmp_path, trial_line(tmp_path))
    elif when.startswith("came-back"):
        if when == "came-back-unchecked":
            (tmp_path / TRIAL_UP).write_text(f"gpuprov.trial={record['id']}\n")
        reboot(tmp_path, DEFAULT_LINE, iommu=False)
    text = HOSTILE_RECORDS[name](record)
    put_record(tmp_path, text)
    default_before = (tmp_path / "etc/default/grub").read_bytes()
    state, why = parse_state(text.encode() if isinstance(text, str) else text)
    assert state is None and why
    result = module(tmp_path)
    assert not result["failed"], result.get("msg")
    assert result["stage"] == "armed"  # replaced by a new trial's record; never committed on
    warning = next(w for w in result["warnings"] if STATE_PATH in w)
    assert "not a trial record" in warning and "unknown" in warning
    assert not any("etc/default/grub" in line for line in result["plan"])
    # Applied (not check mode): the record is replaced, the default byte for byte as it was.
    inputs = gather_boot_inputs(Sysfs(str(tmp_path)), [], [])
    p = plan_boot(inputs, BootRequest(reboot_allowed=True))
    applied(tmp_path, p)
    assert (tmp_path / "etc/default/grub").read_bytes() == default_before
    assert parse_state((tmp_path / TRIAL_STATE).read_bytes())[0] is not None


def test_a_broken_record_never_blocks_the_way_back(tmp_path: Path) -> None:
    """The default already has the arguments (committed) and a broken record is left: the
    clean-up removes it (from its text, nothing in it used) and converges."""
    debian(tmp_path)
    applied(tmp_path, plan(tmp_path))
    reboot(tmp_path, trial_line(tmp_path))
    applied(tmp_path, plan(tmp_path))  # committed
    put_record(tmp_path, "[" * 20000)
    p = plan(tmp_path)
    assert (p.stage, p.refusals) == ("converged", [])
    assert any(a.path == TRIAL_STATE and a.kind == REMOVE_FILE for a in p.actions), p.actions
    applied(tmp_path, p)
    assert not (tmp_path / TRIAL_STATE).exists()


def test_a_well_formed_record_with_hostile_text_is_shown_escaped(tmp_path: Path) -> None:
    """A record that passes its schema may still hold terminal escapes: messages show them escaped."""
    debian(tmp_path)
    record = armed_record(tmp_path)
    put_record(
        tmp_path, json.dumps({**record, "status": "failed", "why": "\x1b[2Jgone", "args_before": "\x1b]0;x\x07"})
    )
    result = module(tmp_path)
    assert result["failed"] and result["stage"] == "refused"
    assert "\x1b" not in result["msg"] and "\\x1b[2Jgone" in result["msg"]


def test_json_depth_scan() -> None:
    assert json_depth('{"a": [["[[[[{{{{"]]}', 3) == 3  # brackets inside strings do not count
    assert json_depth('{"a": "\\"[[[[[["}', 1) == 1  # nor after an escaped quote
    assert json_depth("[[[[[", 4) > 4
    assert json_depth('{"a":' * 5, 4) > 4
    assert json_depth('"unterminated [[[[[', 1) == 0


def test_check_state_keeps_only_known_fields() -> None:
    state, why = check_state({"id": "0123456789ab", "status": "armed", "unconfirmed": 1, "evil": {"a": [1]}})
    assert why is None and state == {"id": "0123456789ab", "status": "armed", "unconfirmed": 1, "added": []}


# -- the trial record: properties ----------------------------------------------------------------

JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
JSON_ANY = st.recursive(
    JSON_LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
FIELDS = ("id", "status", "loader", "armed_boot_id", "unconfirmed", "added", "args_before", "args_after",
          "trial_args", "trial_initrd", "watchdog", "why", "failed_boot_id")  # fmt: skip
GOOD = {
    "id": "0123456789ab",
    "status": "armed",
    "loader": "grub",
    "armed_boot_id": "x",
    "unconfirmed": 0,
    "added": ["intel_iommu=on"],
    "args_before": "quiet",
    "args_after": "quiet intel_iommu=on",
    "trial_args": "quiet intel_iommu=on",
    "trial_initrd": None,
    "watchdog": "i6300esb",
}


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(FIELDS), value=JSON_ANY, drop=st.booleans())
def test_property_a_record_with_any_field_value_parses_or_is_unknown(field: str, value: Any, drop: bool) -> None:
    record = dict(GOOD)
    if drop:
        record.pop(field, None)
    else:
        record[field] = value
    text = json.dumps(record, allow_nan=True)
    state, why = parse_state(text.encode())
    assert (state is None) != (why is None)
    if state is not None:  # what is accepted has the schema's types
        assert isinstance(state["id"], str) and state["status"] in ("armed", "failed")
        assert type(state.get("unconfirmed", 0)) is int and all(isinstance(a, str) for a in state["added"])
        for key in ("args_before", "args_after", "trial_args", "trial_initrd", "watchdog", "why"):
            assert state.get(key) is None or isinstance(state[key], str)


@settings(max_examples=60, deadline=None)
@given(
    raw=st.binary(max_size=400) | st.text(alphabet='[]{}":,0123456789eE.-+ \\anulltrfs', max_size=400).map(str.encode)
)
def test_property_any_bytes_parse_or_are_unknown(raw: bytes) -> None:
    state, why = parse_state(raw)
    assert (state is None) != (why is None)


@pytest.fixture(scope="module")
def armed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("armed")
    debian(root)
    armed_record(root)
    return root


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(FIELDS), value=JSON_ANY, cmdline=st.sampled_from(["default", "trial"]))
def test_property_the_module_answers_any_record(armed_root: Path, field: str, value: Any, cmdline: str) -> None:
    """The module (check mode) on the armed host, its record's field replaced by any JSON value,
    on the arming boot or the trial boot: no exception; a broken record is named and not used."""
    record = json.loads(json.dumps(GOOD))
    original = (armed_root / TRIAL_STATE).read_text()
    real = json.loads(original)
    record.update(id=real["id"], armed_boot_id=real["armed_boot_id"])
    record[field] = value
    put_record(armed_root, json.dumps(record, allow_nan=True))
    (armed_root / "proc/cmdline").write_text((trial_line(armed_root) if cmdline == "trial" else DEFAULT_LINE) + "\n")
    try:
        before = tree_digest(armed_root)
        result = module(armed_root)
        assert tree_digest(armed_root) == before  # check mode
        assert result["stage"] in ("armed", "committed", "failed", "refused"), result
        if parse_state(json.dumps(record, allow_nan=True).encode())[0] is None:
            assert any(STATE_PATH in w for w in result["warnings"]) and result["stage"] != "committed"
    finally:
        put_record(armed_root, original)
        (armed_root / "proc/cmdline").write_text(DEFAULT_LINE + "\n")


# -- GRUB's files: linear readers, size caps ------------------------------------------------------


def _cpu(fn: Any, *args: Any) -> float:
    t0 = time.process_time()
    fn(*args)
    return time.process_time() - t0


@pytest.mark.parametrize(
    "padding",
    [
        pytest.param(
            lambda n: CFG.replace("\tload_video\n", "\tload_video\n" + "\n" * n, 1), id="blank-lines-in-entry"
        ),
        pytest.param(
            lambda n: CFG.replace("\tload_video\n", "\tload_video\n" + " \t\n" * n, 1), id="blank-space-lines"
        ),
        pytest.param(lambda n: "menuentry 'x'\n" * n + CFG, id="entries-never-opened"),
        pytest.param(lambda n: CFG + "menuentry 'x' {\n" * n, id="entries-never-closed"),
        pytest.param(lambda n: CFG.replace("\tlinux\t", "\t" + " " * n + "linux\t", 1), id="long-indent"),
        pytest.param(
            lambda n: CFG.replace("\tinitrd\t", "\tinitrd\t/x" + " " * n + "y\n\tinitrd\t", 1), id="long-initrd"
        ),
    ],
)
def test_a_padded_grub_cfg_reads_in_linear_time(tmp_path: Path, padding: Any) -> None:
    """100,000 lines of padding (issue 26, item 2: the module stalled in check mode): the
    default entry is still found (or refused), well inside the CPU budget, and the module answers."""
    cfg = padding(100_000)
    spent = _cpu(grub_default_entry, cfg, "0", None)
    assert spent < CPU_BUDGET, spent
    entry, problem = grub_default_entry(cfg, "0", None)
    assert entry is not None or problem
    debian(tmp_path)
    (tmp_path / GRUB_CFG).write_text(cfg)
    t0 = time.process_time()
    result = module(tmp_path)
    assert time.process_time() - t0 < CPU_BUDGET
    assert result["stage"] in ("armed", "refused"), result


@pytest.mark.parametrize(
    ("block", "begin", "end"),
    [(custom_cfg, CUSTOM_BEGIN, CUSTOM_END), (_block, MARK_BEGIN, MARK_END)],
)
def test_marked_blocks_read_in_linear_time(block: Any, begin: str, end: str) -> None:
    """custom.cfg and initramfs-tools/modules with many unclosed markers or padded blocks."""
    unclosed = (begin + "\n") * 50_000
    padded = f"{begin}\n" + "\n" * 100_000 + f"{end}\n" + "tail\n"
    for text in (unclosed, padded):
        assert _cpu(block, text, None if block is custom_cfg else ["vfio"]) < CPU_BUDGET
    assert custom_cfg(padded, None) == "tail\n" if block is custom_cfg else _block(padded, ["x"]).endswith("tail\n")


def test_a_grub_cfg_larger_than_gpuprov_reads_is_refused_unchanged(tmp_path: Path) -> None:
    debian(tmp_path)
    (tmp_path / GRUB_CFG).write_text(CFG + "#" * MAX_GRUB_CFG)
    before = tree_digest(tmp_path)
    result = run_in_process("iommu_boot", {"root": str(tmp_path), "reboot_allowed": True})
    assert result["failed"] and "/boot/grub/grub.cfg is" in result["msg"] and "trial: false" in result["msg"]
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize(
    "env", [b"", b"next_entry=gpuprov-trial\n" + b"#" * 1000, b"# GRUB Environment Block\n" * 4000]
)
def test_a_grubenv_grub_cannot_use_refuses_the_trial_unchanged(tmp_path: Path, env: bytes) -> None:
    """No signature (GRUB's load_env rejects it, grub-reboot's one-shot is never spent) or larger
    than an environment block: the trial is refused, naming the file, nothing changed."""
    debian(tmp_path)
    (tmp_path / GRUB_ENV).write_bytes(env)
    before = tree_digest(tmp_path)
    result = run_in_process("iommu_boot", {"root": str(tmp_path), "reboot_allowed": True})
    assert result["failed"] and "/boot/grub/grubenv" in result["msg"], result["msg"]
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("module_name", ["iommu_boot", "kernel_cmdline"])
def test_a_huge_etc_default_grub_is_refused_unchanged(tmp_path: Path, module_name: str) -> None:
    debian(tmp_path)
    grub = (tmp_path / "etc/default/grub").read_text()
    (tmp_path / "etc/default/grub").write_text("\n" * MAX_GRUB_DEFAULT + grub)
    before = tree_digest(tmp_path)
    args = {"reboot_allowed": True} if module_name == "iommu_boot" else {"arguments": ["intel_iommu=on"]}
    t0 = time.process_time()
    result = run_in_process(module_name, {"root": str(tmp_path), **args})
    assert time.process_time() - t0 < CPU_BUDGET
    assert result["failed"] and "/etc/default/grub cannot be edited safely" in result["msg"], result["msg"]
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("module_name", ["iommu_boot", "kernel_cmdline"])
def test_a_huge_proc_cmdline_is_bounded(tmp_path: Path, module_name: str) -> None:
    """A staged root's /proc/cmdline of 8 MiB (the kernel's holds 2 KiB): read up to a cap."""
    debian(tmp_path)
    (tmp_path / "proc/cmdline").write_text(DEFAULT_LINE + ' "' + "a " * (4 << 20))
    args = {"reboot_allowed": True} if module_name == "iommu_boot" else {"arguments": ["intel_iommu=on"]}
    t0 = time.process_time()
    result = run_in_process(module_name, {"root": str(tmp_path), **args}, check=True)
    assert time.process_time() - t0 < CPU_BUDGET
    assert "stage" in result or "reboot_required" in result, result


# -- GRUB's files: the linear readers agree with the regexes they replace -------------------------

OLD_ENTRY = re.compile(r"^menuentry (.*?)\{\n(.*?)^\}\n?", re.M | re.S)


def old_custom_cfg(current: str | None, entry: str | None) -> str | None:
    text = current or ""
    pattern = re.compile(rf"^{re.escape(CUSTOM_BEGIN)}\n.*?^{re.escape(CUSTOM_END)}\n?", re.M | re.S)
    text = pattern.sub("", text)
    if entry is not None:
        text += ("" if text.endswith("\n") or not text else "\n") + f"{CUSTOM_BEGIN}\n{entry}{CUSTOM_END}\n"
    return text if text.strip() else None


def old_block(text: str | None, lines: list[str]) -> str:
    block = "\n".join([MARK_BEGIN, *lines, MARK_END]) + "\n"
    text = text or ""
    pattern = re.compile(rf"^{re.escape(MARK_BEGIN)}\n.*?^{re.escape(MARK_END)}\n?", re.M | re.S)
    if pattern.search(text):
        return pattern.sub(lambda _m: block, text, count=1)
    return text + ("" if text.endswith("\n") or not text else "\n") + block


CFG_LINES = CFG.split("\n")
PIECES = st.sampled_from(
    [
        "",
        " ",
        "\t",
        "}",
        "}x",
        "\t}",
        "{",
        "menuentry 'a' {",
        "menuentry 'b' --id bee {",
        "menuentry 'c' \\",
        "  --id c {",
        "menuentry x",
        "\tlinux\t/boot/vmlinuz-1 root=/dev/x ro",
        "linuxefi /vmlinuz-2 a=b",
        "\tinitrd\t/boot/initrd.img-1",
        "\tinitrd /a /b",
        "initrdefi /i",
        CUSTOM_BEGIN,
        CUSTOM_END,
        CUSTOM_END + "x",
        MARK_BEGIN,
        MARK_END,
        "menuentry 'gpuprov trial' --id gpuprov-trial {",
    ]
)


@st.composite
def mutated_cfg(draw: st.DrawFn) -> str:
    """Debian's grub.cfg with lines inserted, deleted, duplicated; maybe without its last newline."""
    lines = list(CFG_LINES)
    for _ in range(draw(st.integers(0, 8))):
        at = draw(st.integers(0, len(lines)))
        op = draw(st.sampled_from(["insert", "delete", "duplicate"]))
        if op == "insert":
            lines.insert(at, draw(PIECES))
        elif lines and at < len(lines):
            if op == "delete":
                del lines[at]
            else:
                lines.insert(at, lines[at])
    text = "\n".join(lines)
    return text.rstrip("\n") if draw(st.booleans()) else text


@settings(max_examples=60, deadline=None)
@given(cfg=mutated_cfg())
def test_property_menuentries_match_the_old_regex(cfg: str) -> None:
    assert grub_menuentries(cfg) == [(m.group(0), m.group(1), m.group(2)) for m in OLD_ENTRY.finditer(cfg)]
    entry, problem = grub_default_entry(cfg, "0", None)
    assert (entry is None) != (problem is None)
    if entry is not None:
        trial = grub_trial_entry(entry, ["a=1", "gpuprov.trial=x"], "/boot/i.gpuprov-trial", "t")
        assert trial.startswith("menuentry 't' --id gpuprov-trial {\n")
        assert f"{entry.kernel} a=1 gpuprov.trial=x" in trial


@settings(max_examples=60, deadline=None)
@given(cfg=mutated_cfg(), entry=st.sampled_from([None, "menuentry 't' {\n}\n"]))
def test_property_marked_blocks_match_the_old_regex(cfg: str, entry: str | None) -> None:
    assert custom_cfg(cfg, entry) == old_custom_cfg(cfg, entry)
    assert _block(cfg, ["vfio", "vfio_pci"]) == old_block(cfg, ["vfio", "vfio_pci"])


@settings(max_examples=60, deadline=None)
@given(cfg=mutated_cfg(), grub_default=st.sampled_from(["0", "saved", "bee", "'c'", "gnulinux-simple-x", "9"]))
def test_property_the_module_answers_any_grub_cfg(armed_root: Path, cfg: str, grub_default: str) -> None:
    """The module in check mode on a mutated grub.cfg and GRUB_DEFAULT: no exception, nothing
    written, a refusal names what it could not use."""
    cfg_path, grub_path = armed_root / GRUB_CFG, armed_root / "etc/default/grub"
    saved_cfg, saved_grub = cfg_path.read_text(), grub_path.read_text()
    try:
        cfg_path.write_text(cfg)
        grub_path.write_text(saved_grub.replace("GRUB_DEFAULT=0", f"GRUB_DEFAULT={grub_default}"))
        before = tree_digest(armed_root)
        result = module(armed_root)
        assert tree_digest(armed_root) == before
        assert result["stage"] in ("armed", "refused"), result
        if result["stage"] == "refused":
            assert result["failed"] and result["msg"]
    finally:
        cfg_path.write_text(saved_cfg)
        grub_path.write_text(saved_grub)
