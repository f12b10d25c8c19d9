"""Output for people (issue #28 item 4): inspect fits 80 columns without splitting an address or
a verdict, honours COLUMNS and NO_COLOR when piped, indents continuation lines and says a
host-wide blocker once; devices are named as the system's hwdb and the driver (nvidia-smi) name
them, classes by name; topology writes its picture to stdout with "-", colours each GPU by its
verdict with a legend, and gives the GPUs' link matrix as nvidia-smi topo -m does."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from xml.etree import ElementTree

import jsonschema
import pytest
from rich.cells import cell_len

import gpuprov
from gpuprov.cli.main import main
from gpuprov.cli.table import host_wide
from gpuprov.cli.topology_svg import VERDICT_COLOURS
from gpuprov.facts import names
from gpuprov.facts.names import HwdbIds, PciIds, class_name
from gpuprov.report.topology import LINKS, gpus_in, parse_smi_topo
from tests.cli.test_topology import EDU, SVG_NS, sysfs_ports, two_node_switch_host
from tests.conftest import captured_hosts
from tests.fakehost import FakeHost

OUTPUTS = Path(__file__).parents[1] / "fixtures" / "outputs"
TOPOLOGY_SCHEMA = json.loads((Path(gpuprov.__file__).parent / "schemas" / "topology.v1.json").read_text())
INSPECT_SCHEMA = json.loads((Path(gpuprov.__file__).parent / "schemas" / "inspect.v1.json").read_text())
ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
VERDICT = re.compile(r"\bnot ready\b|\bready\b")

# udev's hwdb and pci.ids as a Debian 12 host has them: the hwdb (systemd 252.39, 2025) names the
# H200, the pci.ids package (2023.04) does not.
HWDB = b"""# This file is part of systemd.

pci:v000010DE*
 ID_VENDOR_FROM_DATABASE=NVIDIA Corporation

pci:v000010DEd00002330*
 ID_MODEL_FROM_DATABASE=GH100 [H100 SXM5 80GB]

pci:v000010DEd00002335*
 ID_MODEL_FROM_DATABASE=GH100 [H200 SXM 141GB]

pci:v000010DEd00002335sv000010DEsd000018BF*
 ID_MODEL_FROM_DATABASE=GH100 [H200 SXM 141GB] (subsystem)

pci:v000010DF*
 ID_VENDOR_FROM_DATABASE=Emulex Corporation

pci:v000010DFd00002335*
 ID_MODEL_FROM_DATABASE=Not NVIDIA's
"""
PCI_IDS = "# pci.ids\n10de  NVIDIA Corporation\n\t2330  GH100[H100 SXM5 80GB]\n8086  Intel Corporation\n"


@pytest.fixture
def debian_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(names.HwdbIds, "load", lambda *a, **k: HwdbIds(HWDB))
    monkeypatch.setattr(names.PciIds, "load", lambda *a, **k: PciIds(PCI_IDS))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def inspect_args(name: str, root: Path) -> list[str]:
    return ["inspect", "--all", "--root", str(root), *(["--device", EDU[name]] if name in EDU else [])]


def col0(text: str) -> list[str]:
    """The first word of each line that starts at column 0 (a new line of the output, never a
    continuation); a table's rule as one dash."""
    return [line.split()[0].strip("─") or "─" for line in text.splitlines() if line and not line[0].isspace()]


# ---------------------------------------------------------------- 80 columns, piped, NO_COLOR


@pytest.mark.parametrize("mode", ["piped", "NO_COLOR"])
@pytest.mark.parametrize("name", captured_hosts())
def test_inspect_fits_80_columns_and_splits_no_address_or_verdict(name, mode, host_root, capsys, monkeypatch):
    if mode == "NO_COLOR":
        monkeypatch.setenv("NO_COLOR", "1")
        monkeypatch.setenv("FORCE_COLOR", "1")  # even so: not one escape code
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    args = inspect_args(name, host_root(name))
    monkeypatch.setenv("COLUMNS", "2000")  # nothing wraps: the reference
    wide = run(capsys, *args)
    monkeypatch.setenv("COLUMNS", "80")
    narrow = run(capsys, *args)

    assert "\x1b" not in narrow
    too_wide = [line for line in narrow.splitlines() if cell_len(line) > 80]
    assert not too_wide, too_wide
    assert not [line for line in narrow.splitlines() if line != line.rstrip()]  # no padding at line ends
    # An address or a verdict split over two lines would be missing from the narrow output.
    assert sorted(ADDRESS.findall(narrow)) == sorted(ADDRESS.findall(wide))
    assert sorted(VERDICT.findall(narrow)) == sorted(VERDICT.findall(wide))
    # Every line that wraps goes on indented: as many lines start at column 0 as when nothing wraps.
    assert col0(narrow) == col0(wide)


def test_a_fix_goes_on_under_its_own_text(host_root, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    lines = run(capsys, "inspect", "--root", str(host_root("h200x2-live"))).splitlines()
    at = next(i for i, line in enumerate(lines) if "fix:" in line and "this host is itself a VM" in line)
    start = lines[at].index("this host")
    following = lines[at + 1 : lines.index("", at)]
    assert len(following) >= 2  # it wraps at 80...
    for line in following:  # ...each line under the fix's first word, none from column 0
        assert line[:start].strip() == "" and line[start] != " ", (lines[at], line)
    title = next(i for i, line in enumerate(lines) if line.startswith("Host:"))
    assert lines[title + 1].startswith("    tests/") or lines[title + 1].startswith("    ")


def test_a_host_wide_blocker_is_said_once(host_root, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    root = str(host_root("h200x2-live"))
    report = json.loads(run(capsys, "inspect", "--json", "--root", root))
    assert [[f["code"] for f in g["findings"] if f["severity"] == "blocker"] for g in report["gpus"]] == [
        ["iommu-off"],
        ["iommu-off"],
    ]  # the JSON keeps it on each GPU (a gate reads it there)...
    assert [f["code"] for f in host_wide(report["gpus"])] == ["iommu-off"]
    out = run(capsys, "inspect", "--root", root)
    assert out.count("the IOMMU is off") == 1 and out.count("this host is itself a VM") == 1  # ...people once
    assert "Host-wide, for all 2 GPUs:" in out
    assert out.count("bound to host driver nvidia") == 2  # a GPU's own finding stays with each GPU


def test_a_blocker_of_one_gpu_is_not_host_wide(host_root, capsys) -> None:
    report = json.loads(run(capsys, "inspect", "--json", "--root", str(host_root("boot-vga"))))
    assert host_wide(report["gpus"]) == []


def test_columns_is_honoured_when_piped(host_root, capsys, monkeypatch) -> None:
    root = str(host_root("h200x2-live"))
    monkeypatch.setenv("COLUMNS", "100")
    widths = [cell_len(line) for line in run(capsys, "inspect", "--root", root).splitlines()]
    assert 80 < max(widths) <= 100
    monkeypatch.delenv("COLUMNS")  # piped without it: wide, so logs do not wrap at 80
    widths = [cell_len(line) for line in run(capsys, "inspect", "--root", root).splitlines()]
    assert 100 < max(widths) <= 160


def test_no_color_means_no_style_at_all_even_forced(host_root, capsys, monkeypatch) -> None:
    root = str(host_root("boot-vga"))
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert "\x1b[" in run(capsys, "inspect", "--root", root)  # the colour is really on...
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b" not in run(capsys, "inspect", "--root", root)  # ...and NO_COLOR turns every style off
    assert "\x1b" not in run(capsys, "topology", "--root", root)


# ---------------------------------------------------------------- names


def test_the_h200_is_named_as_its_driver_and_the_hwdb_name_it(host_root, capsys, monkeypatch, debian_names) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    root = str(host_root("h200-live"))
    report = json.loads(run(capsys, "inspect", "--json", "--root", root))
    jsonschema.validate(report, INSPECT_SCHEMA)
    (gpu,) = report["gpus"]
    assert (gpu["product_name"], gpu["name"], gpu["class_name"]) == (
        "NVIDIA H200",  # the driver's (nvidia-smi's) name, from the capture's /proc/driver/nvidia
        "NVIDIA Corporation GH100 [H200 SXM 141GB]",  # the hwdb's: pci.ids 2023 lacks 2335
        "3D controller",
    )
    assert report["host"]["names_from"] == "udev"
    out = run(capsys, "inspect", "--all", "--root", root)
    assert "NVIDIA H200 [10de:2335]" in out and "NVIDIA Corporation [10de:2335]" not in out
    assert "0000:00:06.0 NVIDIA H200 (NVIDIA Corporation GH100 [H200 SXM 141GB]), 3D" in out
    monkeypatch.setenv("COLUMNS", "2000")  # the device list's row on one line
    out = run(capsys, "inspect", "--all", "--root", root)
    assert "0000:00:06.0  3D controller: NVIDIA H200 (NVIDIA Corporation GH100 [H200 SXM 141GB]) [10de:2335]" in out
    (entry,) = gpus_in(json.loads(run(capsys, "topology", "--json", "--root", root)))
    assert (entry["product_name"], entry["name"]) == ("NVIDIA H200", "NVIDIA Corporation GH100 [H200 SXM 141GB]")
    assert "GPU 0000:00:06.0 NVIDIA H200 [10de:2335], driver nvidia" in run(capsys, "topology", "--root", root)


def test_a_captured_nvidia_smi_names_the_gpu_without_proc_driver(host_root, capsys, debian_names) -> None:
    """An older capture has nvidia-smi -q -x but not /proc/driver/nvidia/gpus."""
    root = host_root("h100-passthrough-guest")
    assert not (root / "proc/driver/nvidia/gpus").exists() and (root / "capture/nvidia-smi-q-x").exists()
    (gpu,) = json.loads(run(capsys, "inspect", "--json", "--root", str(root)))["gpus"]
    assert (gpu["product_name"], gpu["name"]) == ("NVIDIA H100 80GB HBM3", "NVIDIA Corporation GH100 [H100 SXM5 80GB]")


def test_without_the_hwdb_pci_ids_names_what_it_knows(host_root, capsys, monkeypatch) -> None:
    """Only the vendor known: "Device 2335" as lspci says, never the vendor's name alone."""
    monkeypatch.setattr(names.HwdbIds, "load", lambda *a, **k: None)
    monkeypatch.setattr(names.PciIds, "load", lambda *a, **k: PciIds(PCI_IDS))
    root = str(host_root("h200x2-live"))
    report = json.loads(run(capsys, "inspect", "--json", "--root", root))
    assert report["host"]["names_from"] == "pci.ids"
    assert {g["name"] for g in report["gpus"]} == {"NVIDIA Corporation Device 2335"}
    assert {g["product_name"] for g in report["gpus"]} == {"NVIDIA H200"}
    monkeypatch.setattr(names.PciIds, "load", lambda *a, **k: None)
    report = json.loads(run(capsys, "inspect", "--json", "--root", root))
    assert report["host"]["names_from"] == "none" and {g["name"] for g in report["gpus"]} == {"[10de:2335]"}


def test_hwdb_lookups() -> None:
    hwdb = HwdbIds(HWDB)
    assert hwdb.lookup(0x10DE, 0x2335) == ("NVIDIA Corporation", "GH100 [H200 SXM 141GB]")  # not the subsystem's
    assert hwdb.lookup(0x10DE, 0x2330) == ("NVIDIA Corporation", "GH100 [H100 SXM5 80GB]")
    assert hwdb.lookup(0x10DE, 0x9999) == ("NVIDIA Corporation", None)
    assert hwdb.lookup(0x10DF, 0x2335) == ("Emulex Corporation", "Not NVIDIA's")  # the next vendor's own
    assert hwdb.lookup(0x10DF, 0x2330) == ("Emulex Corporation", None)  # not NVIDIA's 2330
    assert hwdb.lookup(0x1234, 0x11E8) == (None, None)
    assert hwdb.lookup(None, None) == (None, None) and hwdb.lookup(0x10DE, None) == ("NVIDIA Corporation", None)
    # Devices listed without their vendor's own entry still name the device.
    assert HwdbIds(b"\npci:v00001AF4d00001009*\n ID_MODEL_FROM_DATABASE=Virtio filesystem\n").lookup(
        0x1AF4, 0x1009
    ) == (None, "Virtio filesystem")


def test_the_system_hwdb_reads(monkeypatch) -> None:
    """This machine's own hwdb, where it has one (udev ships 20-pci-vendor-model.hwdb)."""
    hwdb = HwdbIds.load()
    if hwdb is None:
        pytest.skip("no udev hwdb source here (/usr/lib/udev/hwdb.d/20-pci-vendor-model.hwdb)")
    vendor, device = hwdb.lookup(0x10DE, 0x2330)
    assert vendor == "NVIDIA Corporation" and device and "H100" in device


def test_classes_have_names(host_root, capsys, debian_names) -> None:
    assert class_name(0x030200) == "3D controller"
    assert class_name(0x030000) == "VGA compatible controller"
    assert class_name(0x038000) == "Display controller"
    assert class_name(0x040300) == "Audio device"
    assert class_name(0x060400) == "PCI bridge"
    assert class_name(0x00FF00) == "Unclassified device"  # QEMU's edu: a subclass without a name, its base's
    assert class_name(0x7F0000) is None and class_name(None) is None
    report = json.loads(run(capsys, "inspect", "--json", "--root", str(host_root("boot-vga"))))
    assert {d["address"]: d["class_name"] for d in report["pci_devices"]}["0000:00:02.0"] == "VGA compatible controller"
    out = " ".join(run(capsys, "inspect", "--all", "--root", str(host_root("boot-vga"))).split())
    assert "VGA compatible controller [1234:1111]" in out and "Display controller [1234:1111]" in out
    assert " 030000 " not in out


def test_a_companion_without_a_driver_says_no_driver(fake: FakeHost, capsys) -> None:
    fake.pci("0000:41:00.0", cls=0x030200, group=5, driver="nvidia")
    fake.pci("0000:41:00.1", cls=0x040300, group=5, device=0x22BA)
    root = str(fake.finish())
    report = json.loads(run(capsys, "inspect", "--json", "--root", root))
    (companion,) = [f for f in report["gpus"][0]["findings"] if f["code"] == "companion"]
    assert companion["message"] == "companion HD audio 0000:41:00.1 (no driver) must be passed through with it"
    assert "None" not in run(capsys, "inspect", "--all", "--root", root)


# ---------------------------------------------------------------- topology


def test_a_picture_to_stdout(host_root, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = str(host_root("boot-vga"))
    svg = ElementTree.fromstring(run(capsys, "topology", "--root", root, "--svg", "-").encode())
    assert svg.tag == f"{SVG_NS}svg"
    page = run(capsys, "topology", "--root", root, "--html", "-")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>") and "wrote" not in page
    assert not (tmp_path / "-").exists()
    assert main(["topology", "--root", root, "--svg", "-", "--json"]) == 2
    assert "both write to stdout" in capsys.readouterr().err


def fills(svg_text: str) -> dict[str, str]:
    """GPU address -> the fill of its box."""
    found = {}
    for g in ElementTree.fromstring(svg_text.encode()).iter(f"{SVG_NS}g"):
        if g.get("class") == "gpu":
            first = next(t.text or "" for t in g.iter(f"{SVG_NS}text"))
            found[first.split()[1]] = next(g.iter(f"{SVG_NS}rect")).get("fill", "")
    return found


@pytest.mark.parametrize("name", captured_hosts())
def test_each_gpu_is_coloured_by_its_verdict_as_inspect_gives_it(name, host_root, capsys) -> None:
    root = host_root(name)
    extra = ["--device", EDU[name]] if name in EDU else []
    document = json.loads(run(capsys, "topology", "--json", "--root", str(root), *extra))
    jsonschema.validate(document, TOPOLOGY_SCHEMA)
    report = json.loads(run(capsys, "inspect", "--json", "--root", str(root), *extra))
    ready = {g["address"]: g["ready"] for g in report["gpus"]}
    verdicts = {g["address"]: g["verdict"] for g in gpus_in(document)}
    assert {a: v in ("ready", "ready, with warnings") for a, v in verdicts.items()} == ready
    svg = run(capsys, "topology", "--root", str(root), *extra, "--svg", "-")
    assert fills(svg) == {a: VERDICT_COLOURS[v][0] for a, v in verdicts.items()}
    legend = next(g for g in ElementTree.fromstring(svg.encode()).iter(f"{SVG_NS}g") if g.get("class") == "legend")
    words = [t.text for t in legend.iter(f"{SVG_NS}text")]
    squares = [r.get("fill") for r in legend.iter(f"{SVG_NS}rect")]
    for verdict, (fill, _) in VERDICT_COLOURS.items():
        assert f"GPU {verdict}" in words and fill in squares


def test_the_boot_display_and_a_gpu_with_the_hosts_nic_are_not_green(host_root, capsys) -> None:
    red, green = VERDICT_COLOURS["not ready"][0], VERDICT_COLOURS["ready"][0]
    svg = run(capsys, "topology", "--root", str(host_root("boot-vga")), "--svg", "-")
    assert fills(svg) == {"0000:00:02.0": red, "0000:02:00.0": green}
    svg = run(capsys, "topology", "--root", str(host_root("gpu-bridge-nic")), "--device", "0000:02:01.0", "--svg", "-")
    assert fills(svg) == {"0000:02:01.0": red}
    assert "carries the default route" in svg


def expected_link(root: Path, a: str, b: str) -> str:
    """The PCIe link between a and b read from sysfs here, not by gpuprov: nvidia-smi's words."""
    if a == b:
        return "X"

    def bus(address: str) -> str:
        real = os.path.realpath(root / "sys/bus/pci/devices" / address)
        return next(p for p in real.split(os.sep) if p.startswith("pci") and ":" in p)

    def node(address: str) -> int:
        text = (root / "sys/bus/pci/devices" / address / "numa_node").read_text().strip()
        return int(text)

    if bus(a) != bus(b):
        nodes = (node(a), node(b))
        return "SYS" if min(nodes) >= 0 and nodes[0] != nodes[1] else "NODE"
    pa, pb = sysfs_ports(root, a), sysfs_ports(root, b)
    common = next((i for i, (x, y) in enumerate(zip(pa, pb)) if x != y), min(len(pa), len(pb)))
    if not common:
        return "PHB"
    return "PIX" if max(len(pa), len(pb)) - common <= 1 else "PXB"


@pytest.mark.parametrize("name", captured_hosts())
def test_the_link_matrix_is_what_the_facts_say(name, host_root, capsys) -> None:
    root = host_root(name)
    extra = ["--device", EDU[name]] if name in EDU else []
    matrix = json.loads(run(capsys, "topology", "--json", "--root", str(root), *extra))["link_matrix"]
    document = json.loads(run(capsys, "topology", "--json", "--root", str(root), *extra))
    assert matrix["gpus"] == sorted(g["address"] for g in gpus_in(document))
    assert matrix["rows"] == [[expected_link(root, a, b) for b in matrix["gpus"]] for a in matrix["gpus"]]
    # NVLinks only from what the capture holds of nvidia-smi topo -m (older captures: one GPU, none).
    topo = root / "capture/nvidia-smi-topo"
    assert (matrix["nvlinks_from"] is not None) == topo.exists()


def test_the_link_matrix_of_the_two_h200s(host_root, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    root = str(host_root("h200x2-live"))
    matrix = json.loads(run(capsys, "topology", "--json", "--root", root))["link_matrix"]
    # Both on the guest's root bus: PCIe through its host bridge (nvidia-smi there: NV18, which sysfs does not show).
    assert matrix == {
        "gpus": ["0000:00:06.0", "0000:00:07.0"],
        "rows": [["X", "PHB"], ["PHB", "X"]],
        "nvlinks_from": None,
    }
    out = run(capsys, "topology", "--root", root)
    assert "GPU0 0000:00:06.0  X     PHB" in out and "GPU1 0000:00:07.0  PHB   X" in out
    assert "NVLinks unknown" in out and f"PHB  {LINKS['PHB']}" in out
    assert max(cell_len(line) for line in out.splitlines()) <= 80


def test_nvlinks_from_a_captured_nvidia_smi_topo(host_root, capsys, tmp_path) -> None:
    root = tmp_path / "root"
    shutil.copytree(host_root("h200x2-live"), root, symlinks=True)
    (root / "capture/nvidia-smi-topo").write_text((OUTPUTS / "h200x2/topo.txt").read_text())
    document = json.loads(run(capsys, "topology", "--json", "--root", str(root)))
    jsonschema.validate(document, TOPOLOGY_SCHEMA)
    matrix = document["link_matrix"]
    assert matrix["rows"] == [["X", "NV18"], ["NV18", "X"]]  # as nvidia-smi topo -m printed on that machine
    assert "nvidia-smi topo -m" in matrix["nvlinks_from"]
    out = run(capsys, "topology", "--root", str(root))
    assert "NV18" in out and f"NV#  {LINKS['NV#']}" in out


def test_parse_smi_topo() -> None:
    text = (OUTPUTS / "h200x2/topo.txt").read_text()
    assert parse_smi_topo(text, ["0000:00:06.0", "0000:00:07.0"]) == {frozenset(("0000:00:06.0", "0000:00:07.0")): 18}
    assert parse_smi_topo(text, ["0000:00:06.0"]) == {}  # a GPU it does not know of: nothing
    assert parse_smi_topo("GPU0\tGPU1\nGPU0\tX\tPIX\nGPU1\tPIX\tX\n", ["a", "b"]) == {}  # no NVLink


def test_the_two_node_host_matrix(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    root = str(two_node_switch_host(tmp_path / "root"))
    matrix = json.loads(run(capsys, "topology", "--json", "--root", root))["link_matrix"]
    assert matrix["rows"] == [
        ["X", "PIX", "SYS", "SYS"],  # 03:00.0 and 04:00.0 behind one switch; node 1's GPUs across the nodes
        ["PIX", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "PHB"],  # 81:00.0 and 82:00.0 behind two root ports of one root bus
        ["SYS", "SYS", "PHB", "X"],
    ]
    out = run(capsys, "topology", "--root", root)
    assert max(cell_len(line) for line in out.splitlines()) <= 80
    assert [line.split()[2:] for line in out.splitlines() if re.match(r"GPU\d ", line)] == matrix["rows"]


@pytest.mark.parametrize("name", captured_hosts())
def test_the_topology_tree_fits_80_columns(name, host_root, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    extra = ["--device", EDU[name]] if name in EDU else []
    out = run(capsys, "topology", "--root", str(host_root(name)), *extra)
    assert max(cell_len(line) for line in out.splitlines()) <= 80
    assert "driver None" not in out and "(None" not in out
