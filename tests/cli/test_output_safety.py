"""Issue #11 item 6: values from a host or a file never steer the terminal or Rich.

One fake host per hostile payload, with the payload in every place a value
reaches output (uevent DRIVER, pci.ids names, NIC/bridge and block device names,
a mount point, a process name, mdev type names, os-release, a kernel argument,
a VM name, nvidia-smi product name and driver version). inspect (table, --all,
--json), plan (table, --json) and verify (table, --json) must exit as they do on
the same host with a clean value, show the value escaped, put no raw control
character on the terminal, and carry the exact value in JSON (docs/output.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from gpuprov.cli.main import main
from gpuprov.cli.table import ValueTable
from gpuprov.cli.textsafe import safe_data, safe_text
from gpuprov.facts import names
from gpuprov.inputs.validate import shown as shown_value
from tests.fakehost import FakeHost
from tests.vmhosts import GIB_KIB, add_numa

GPU, NIC, NVME = "0000:41:00.0", "0000:41:00.2", "0000:41:00.3"

# Hostile values, each a case of category 6 in every place below.
PAYLOADS = {
    "markup closing tag": "[/oops]",
    "markup style": "[red]x[/red]",
    "markup link": "[link=http://x]y[/link]",
    "markup bold, no slash": "[bold]loud",
    "emoji code": ":thumbs_up:",
    "ESC clear screen": "a\x1b[2Jb",
    "ESC colour": "\x1b[31mred\x1b[0m",
    "OSC 52 clipboard": "\x1b]52;c;cm0gLXJmIH4K\x07",
    "OSC 8 hyperlink": "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\",
    "BEL": "ding\x07",
    "backspaces": "good\x08\x08\x08\x08evil",
    "CR overwrite": "safe\rEVIL",
    "NUL and DEL": "a\x00b\x7fc",
    "C1 CSI": "x\x9b2Jy",
    "bidi override": "abc\u202etxt.exe",
    "bidi isolate and marks": "\u2066a\u2069\u200e\u200f\u061c",
    "line separator": "one\u2028two",
}
# Control characters no terminal may receive raw (LF aside: the tables' own line breaks).
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
SGR = re.compile("\x1b\\[[0-9;]*m")


def token(text: str) -> str:
    """The payload as it can be a file name or one whitespace-split field."""
    return "".join(c for c in text if not c.isspace() and c not in "/\x00") or "x"


def line(text: str) -> str:
    """The payload as it can be one line of a line-based file."""
    return "".join(c for c in text if c not in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029") or "x"


def xml_text(text: str) -> str:
    """The payload as XML 1.0 character data: C0 other than TAB/LF/CR cannot be written at all."""
    text = "".join(c for c in text if c >= " " or c in "\t\r") or "x"
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\r", "&#13;")


def xml_value(text: str) -> str:
    """What the XML parser gives back for :func:`xml_text`."""
    return ("".join(c for c in text if c >= " " or c in "\t\r") or "x").strip()


def build_host(root: Path, value: str) -> dict[str, str]:
    """A host whose GPU shares its group with an addressed NIC and a mounted NVMe disk, and
    whose every name is ``value``; returns place -> the value as the readers will show it."""
    tok, one = token(value), line(value)
    fake = FakeHost(root)
    fake.cmdline += f" vfio-pci.ids={tok}"
    fake.write("etc/os-release", f'PRETTY_NAME="{one}"\n')
    gpu = fake.pci(GPU, cls=0x030200, group=5, numa_node=0)
    fake.write(f"{gpu}/uevent", f"DRIVER={one}\nPCI_CLASS=30200\nPCI_ID=10DE:2330\nPCI_SUBSYS_ID=10DE:1234\n")
    fake.mdev_types(GPU, {f"nvidia-{tok}": (value.strip() or "x", 2)})
    fake.pci(NIC, cls=0x020000, vendor=0x8086, device=0x10D3, group=5, driver="e1000e")
    fake.net(tok, NIC, master=f"br{tok}")
    fake.net(f"br{tok}", None, ipv4="10.0.0.5", gateway="10.0.0.1")
    fake.pci(NVME, cls=0x010802, vendor=0x1B36, device=0x0010, group=5, driver="nvme")
    fake.block(f"nvme{tok}", NVME)
    fake.mount(f"/dev/nvme{tok}", f"/srv/{tok}")
    fake.open_file(4242, value.strip() or "x", "/dev/vfio/5")
    add_numa(fake, [("0-7", 64 * GIB_KIB, {})])
    fake.write("proc/driver/nvidia/version", f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.1  {one}\n")
    fake.write(
        "capture/nvidia-smi-q-x",
        "<?xml version='1.0'?>\n<nvidia_smi_log><driver_version>580.1</driver_version>"
        f"<cuda_version>13.0</cuda_version><gpu id='00000000:41:00.0'>"
        f"<product_name>{xml_text(value)}</product_name><uuid>GPU-{xml_text(value)}</uuid>"
        f"<product_architecture>{xml_text(value)}</product_architecture>"
        "<pci><pci_bus_id>00000000:41:00.0</pci_bus_id></pci>"
        "<fb_memory_usage><total>81559 MiB</total></fb_memory_usage></gpu></nvidia_smi_log>\n",
    )
    fake.finish()
    return {
        "uevent DRIVER": one,
        "pci.ids vendor name": value.strip() or "x",
        "hwdb name": f"{line(value).strip()} NVMe",
        "NIC and bridge names": tok,
        "block device name": f"nvme{tok}",
        "mount point": f"/srv/{tok}",
        "process name": value.strip() or "x",
        "mdev type name": value.strip() or "x",
        "os-release": one,
        "kernel argument": tok,
        "VM name": value,
        "nvidia-smi product name": xml_value(value),
    }


def write_vms(path: Path, name: str) -> Path:
    path.write_text(yaml.safe_dump([{"name": name, "memory_mib": 128, "gpus": [GPU], "pin": False}]))
    return path


def fake_pci_ids(value: str) -> Callable[..., names.PciIds]:
    text = f"# pci.ids\n10de  {line(value) or 'x'}\n\t2330  {line(value) or 'x'} GPU\n8086  Intel\n"
    return lambda *a, **k: names.PciIds(text)


def fake_hwdb(value: str) -> Callable[..., names.HwdbIds]:
    """udev's hwdb naming the NVMe controller (1b36:0010) ``value``; the GPU is left to pci.ids."""
    text = f"# hwdb\npci:v00001B36*\n ID_VENDOR_FROM_DATABASE={line(value)}\n\n"
    text += f"pci:v00001B36d00000010*\n ID_MODEL_FROM_DATABASE={line(value)} NVMe\n"
    return lambda *a, **k: names.HwdbIds(text.encode("utf-8", "surrogateescape"))


RUNS = {
    "inspect": lambda root, vms: ["inspect", "--root", str(root)],
    "inspect --all": lambda root, vms: ["inspect", "--all", "--root", str(root)],
    "inspect --json": lambda root, vms: ["inspect", "--json", "--root", str(root)],
    "plan": lambda root, vms: ["plan", str(vms), "--root", str(root)],
    "plan --json": lambda root, vms: ["plan", str(vms), "--json", "--root", str(root)],
    "verify": lambda root, vms: ["verify", "--root", str(root)],
    "verify --json": lambda root, vms: ["verify", "--json", "--root", str(root)],
}


def run_all(tmp: Path, value: str, capsys, monkeypatch) -> tuple[dict[str, str], dict[str, tuple[int, str, str]]]:
    monkeypatch.setattr(names.PciIds, "load", fake_pci_ids(value))
    monkeypatch.setattr(names.HwdbIds, "load", fake_hwdb(value))
    root = tmp / "root"
    shown = build_host(root, value)
    vms = write_vms(tmp / "vms.yml", value)
    results = {}
    for run, argv in RUNS.items():
        rc = main(argv(root, vms))
        out, err = capsys.readouterr()
        results[run] = (rc, out, err)
    return shown, results


@pytest.fixture
def clean_codes(tmp_path: Path, capsys, monkeypatch) -> dict[str, int]:
    _, results = run_all(tmp_path / "clean", "clean", capsys, monkeypatch)
    return {run: rc for run, (rc, _, _) in results.items()}


@pytest.mark.parametrize("value", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_hostile_values_are_shown_escaped(value, clean_codes, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "2000")  # no folding: each value on one line of the table
    shown, results = run_all(tmp_path / "hostile", value, capsys, monkeypatch)
    for run, (rc, out, err) in results.items():
        assert "Traceback" not in err, (run, err)
        assert not RAW.search(out + err), (run, RAW.findall(out + err))
        if rc == 2 and run.startswith("plan"):
            # The VM-name rules (the validation boundary) may refuse the name: the message quotes
            # it escaped, as the validator shows every value (a bounded repr, docs/reference/inputs.md).
            assert "gpuprov: error:" in err and shown_value(value) in err, err
            continue
        assert rc == clean_codes[run], (run, rc, err)
        if run.endswith("--json"):
            assert out.isascii()  # json.dumps escapes every control character itself
            json.loads(out)
    text = {run: out for run, (rc, out, _) in results.items() if not run.endswith("--json") and rc != 2}
    inspect_out = text["inspect"] + text["inspect --all"]
    for place in ("uevent DRIVER", "pci.ids vendor name", "hwdb name", "NIC and bridge names", "block device name"):
        assert safe_text(shown[place]) in inspect_out, place
    assert safe_text(shown["nvidia-smi product name"]) in text["inspect"]  # the GPU's name, as the driver gives it
    for place in ("mount point", "process name", "mdev type name", "os-release", "kernel argument"):
        assert safe_text(shown[place]) in inspect_out, place
    if "plan" in text:
        assert safe_text(shown["VM name"]) in text["plan"]
    assert safe_text(shown["nvidia-smi product name"]) in text["verify"]


@pytest.mark.parametrize("value", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_json_carries_the_exact_value(value, tmp_path, capsys, monkeypatch) -> None:
    shown, results = run_all(tmp_path, value, capsys, monkeypatch)
    report = json.loads(results["inspect --json"][1])
    (gpu,) = report["gpus"]
    assert gpu["driver"] == shown["uevent DRIVER"]
    assert gpu["vgpu"]["mdev_types"][0]["name"] == shown["mdev type name"]
    assert report["host"]["os"] == shown["os-release"]
    assert {n["name"] for n in report["host_needs"]["net"]} == {shown["NIC and bridge names"], "br" + token(value)}
    verify = json.loads(results["verify --json"][1])
    assert verify["gpus"][0]["name"] == shown["nvidia-smi product name"]
    rc, out, _ = results["plan --json"]
    if rc != 2:  # the name is in the plan, or quoted by the refusal of its spelling
        plan = json.loads(out)
        assert [vm["name"] for vm in plan["vms"]] == [value] or f"VM {value}:" in plan["refusals"][0]["message"]


def test_a_terminal_gets_only_rich_own_colour_codes(tmp_path, capsys, monkeypatch) -> None:
    """On a colour terminal the only escape sequences are Rich's own SGR colours."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    value = "".join(PAYLOADS.values())
    _, results = run_all(tmp_path, value, capsys, monkeypatch)
    for run, (rc, out, err) in results.items():
        if run.endswith("--json"):
            continue
        if not (rc == 2 and run.startswith("plan")):  # a name the validator refused: no table
            assert SGR.search(out), run  # the colour is really on
        assert not RAW.search(SGR.sub("", out + err)), run


def test_no_color_output_is_plain(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    _, results = run_all(tmp_path, PAYLOADS["ESC colour"], capsys, monkeypatch)
    assert not any("\x1b" in out + err for _, out, err in results.values())
    assert "\\x1b[31mred\\x1b[0m" in results["inspect"][1]


def test_an_undecodable_file_name_is_shown_escaped(fake, capsys) -> None:
    """A holder whose name is not UTF-8 lists as a lone surrogate, which raises if printed raw."""
    fake.pci(GPU, cls=0x030000, group=5, driver="nvidia")
    fake.pci(NVME, cls=0x010802, group=5, driver="nvme")
    fake.block("nvme0n1", NVME)
    holder = fake.root / fake.paths[NVME] / "nvme/nvme0/nvme0n1/holders" / b"dm-\xff".decode("utf-8", "surrogateescape")
    holder.mkdir()
    root = fake.finish()
    assert main(["inspect", "--root", str(root)]) == 0
    assert "controls block device nvme0n1 (held by dm-\\udcff)" in capsys.readouterr().out
    assert main(["inspect", "--json", "--root", str(root)]) == 0
    assert "held by dm-\udcff" in json.loads(capsys.readouterr().out)["host_needs"]["block"][0]["uses"]


# ---------------------------------------------------------------- the helpers themselves


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("\x07", "\\x07"),
        ("a\rb", "a\\x0db"),
        ("a\nb", "a\\x0ab"),
        ("\t", "\\x09"),
        ("\x7f", "\\x7f"),
        ("\x9b", "\\x9b"),
        ("\u202e", "\\u202e"),
        ("\u2067", "\\u2067"),
        ("\udcff", "\\udcff"),
        ("GH100 [H100 SXM5 80GB] ünïcode ✓", "GH100 [H100 SXM5 80GB] ünïcode ✓"),
    ],
)
def test_safe_text(raw: str, shown: str) -> None:
    assert safe_text(raw) == shown


def test_safe_text_keeps_newlines_when_asked() -> None:
    assert safe_text("a\nb\r", keep_newlines=True) == "a\nb\\x0d"


def test_safe_data_escapes_keys_and_values_and_keeps_the_rest() -> None:
    data: dict[str, Any] = {"\x1b": ["\x07", 1, None, True, {"k": 2.5}]}
    assert safe_data(data) == {"\\x1b": ["\\x07", 1, None, True, {"k": 2.5}]}


@given(st.text())
def test_safe_text_leaves_nothing_raw_and_is_idempotent(text: str) -> None:
    once = safe_text(text)
    assert not RAW.search(once) and "\n" not in once
    assert safe_text(once) == once
    if not RAW.search(text) and "\n" not in text and not re.search("[\ud800-\udfff]", text):
        assert once == text


def test_a_value_table_never_parses_markup_on_any_console() -> None:
    """A column added later with a raw value cannot crash or restyle the table."""
    console = Console(record=True, markup=True, emoji=True, width=200)
    table = ValueTable(title="[/oops]")
    table.add_column("name")
    table.add_row("[/x] [red]x[/red] :thumbs_up: \x1b[2J")
    console.print(table)
    text = console.export_text()
    assert "[/oops]" in text and "[/x] [red]x[/red] :thumbs_up: \\x1b[2J" in text


# The places each payload is put in (the count of category-6 cases is payloads x places).
PLACES = (
    "uevent DRIVER",
    "pci.ids vendor name",
    "NIC and bridge names",
    "block device name",
    "mount point",
    "process name",
    "mdev type name",
    "os-release",
    "kernel argument",
    "VM name",
    "nvidia-smi product name",
)
