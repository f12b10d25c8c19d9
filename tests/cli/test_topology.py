"""gpuprov topology: every GPU under its NUMA node and the ports above it, on the captured
hosts and a two-node fake host; host values escaped in every view; the SVG/HTML picture drawn
by headless Chromium and looked at."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import jsonschema
import pytest

import gpuprov
from gpuprov.cli.main import main
from gpuprov.cli.topology_svg import COLUMN_FILL, VERDICT_COLOURS, render_html, render_svg
from gpuprov.facts import names
from gpuprov.facts.host import gather
from gpuprov.facts.sysfs import Sysfs
from gpuprov.report.topology import build_topology, gpus_in
from gpuprov.rules.assess import is_gpu
from tests.conftest import captured_hosts
from tests.fakehost import FakeHost
from tests.vmhosts import GIB_KIB, add_numa

SCHEMA = json.loads((Path(gpuprov.__file__).parent / "schemas" / "topology.v1.json").read_text())
SVG_NS = "{http://www.w3.org/2000/svg}"
# The emulated hosts' edu device (1234:11e8) stands in for a GPU (tests/fixtures/hosts/README.md).
EDU = {
    "gpu-alone": "0000:01:00.0",
    "gpu-audio": "0000:01:00.0",
    "gpu-bridge-nic": "0000:02:01.0",
    "gpu-switch": "0000:03:00.0",
    "nvme-swap": "0000:03:00.0",
    "vfio-bound": "0000:01:00.0",
    "mtty-mdev": "0000:01:00.0",
}


def topology(capsys: pytest.CaptureFixture[str], root: Path | str, *extra: str) -> dict[str, Any]:
    assert main(["topology", "--json", "--root", str(root), *extra]) == 0
    return json.loads(capsys.readouterr().out)


def placements(document: dict[str, Any]) -> dict[str, tuple[int | None, list[tuple[str, str]]]]:
    """GPU address -> (its NUMA node, the (role, address) of each port above it, outermost first)."""
    found: dict[str, tuple[int | None, list[tuple[str, str]]]] = {}

    def walk(entries: list[dict[str, Any]], node: int | None, above: list[tuple[str, str]]) -> None:
        for e in entries:
            if e["kind"] == "gpu":
                assert e["address"] not in found, f"{e['address']} drawn twice"
                found[e["address"]] = (node, above)
            else:
                walk(e["children"], node, [*above, (e["role"], e["address"])])

    for n in document["numa_nodes"]:
        for bus in n["root_buses"]:
            walk(bus["children"], n["node"], [])
    return found


def sysfs_ports(root: Path, address: str) -> list[str]:
    """The PCI addresses above ``address`` in its canonical sysfs path (read here, not by gpuprov)."""
    real = os.path.realpath(root / "sys/bus/pci/devices" / address)
    parts = real.split(os.sep)
    return [p for p in parts[parts.index(address) - 1 : 0 : -1] if p.count(":") == 2][::-1]


# ---------------------------------------------------------------- the tree on captured hosts


@pytest.mark.parametrize("name", captured_hosts())
def test_every_gpu_is_under_its_numa_node_and_the_ports_above_it(name: str, host_root, capsys) -> None:
    root = host_root(name)
    extra = ["--device", EDU[name]] if name in EDU else []
    document = topology(capsys, root, *extra)
    jsonschema.validate(document, SCHEMA)
    facts = gather(Sysfs(str(root)))
    gpus = {a for a, d in facts.pci.items() if is_gpu(d)} | set(extra[1:])
    placed = placements(document)
    assert set(placed) == gpus
    assert document["gpu_count"] == len(gpus)
    for address, (node, above) in placed.items():
        assert node == facts.pci[address].numa_node
        assert [a for _, a in above] == sysfs_ports(root, address)
        if above:
            assert above[0][0] == "root port"


def test_a_gpu_behind_a_switch(host_root, capsys) -> None:
    placed = placements(topology(capsys, host_root("gpu-switch"), "--device", "0000:03:00.0"))
    assert placed["0000:03:00.0"] == (
        None,
        [
            ("root port", "0000:00:01.0"),
            ("switch upstream port", "0000:01:00.0"),
            ("switch downstream port", "0000:02:00.0"),
        ],
    )


def test_a_pcie_to_pci_bridge_is_a_bridge_and_the_nic_in_the_group_is_shown(host_root, capsys) -> None:
    document = topology(capsys, host_root("gpu-bridge-nic"), "--device", "0000:02:01.0")
    assert placements(document)["0000:02:01.0"][1] == [("root port", "0000:00:01.0"), ("bridge", "0000:01:00.0")]
    (gpu,) = gpus_in(document)
    assert {m["address"]: m["relation"] for m in gpu["members"]} == {
        "0000:01:00.0": "bridge",
        "0000:02:02.0": "group member",
    }


def test_companions_and_group_members(host_root, capsys) -> None:
    (audio,) = gpus_in(topology(capsys, host_root("gpu-audio"), "--device", "0000:01:00.0"))
    assert [(m["address"], m["relation"], m["driver"]) for m in audio["members"]] == [
        ("0000:01:00.1", "companion", "snd_hda_intel")
    ]
    assert audio["iommu_group"] == "6"
    (alone,) = gpus_in(topology(capsys, host_root("gpu-alone"), "--device", "0000:01:00.0"))
    assert alone["members"] == []
    (swap,) = gpus_in(topology(capsys, host_root("nvme-swap"), "--device", "0000:03:00.0"))
    assert {m["address"]: m["relation"] for m in swap["members"]} == {
        "0000:00:1c.0": "bridge",
        "0000:00:1c.1": "bridge",
        "0000:04:00.0": "group member",
    }


def test_gpus_on_the_root_bus_and_behind_root_ports(host_root, capsys) -> None:
    placed = placements(topology(capsys, host_root("boot-vga")))
    assert placed == {"0000:00:02.0": (None, []), "0000:02:00.0": (None, [("root port", "0000:00:03.0")])}


def test_the_terminal_tree_nests_each_level_under_the_one_above(host_root, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["topology", "--root", str(host_root("gpu-switch")), "--device", "0000:03:00.0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    wanted = [
        "NUMA node not reported",
        "root bus 0000:00",
        "root port 0000:00:01.0",
        "switch upstream port 0000:01:00.0",
        "switch downstream port 0000:02:00.0",
        "GPU 0000:03:00.0 [1234:11e8], no driver, IOMMU group 7",
        "port in the group (stays with the host) 0000:02:00.0",
    ]
    rows = [next(i for i, line in enumerate(lines) if w in line) for w in wanted]
    assert rows == sorted(rows)
    indents = [lines[r].index(w) for r, w in zip(rows, wanted)]
    assert indents == sorted(indents) and len(set(indents)) == len(indents)


def test_bad_device_and_unwritable_picture_are_bad_input(host_root, capsys, tmp_path) -> None:
    root = str(host_root("gpu-alone"))
    assert main(["topology", "--root", root, "--device", "0000:09:00.0"]) == 2
    assert "no PCI device 0000:09:00.0" in capsys.readouterr().err
    assert main(["topology", "--root", root, "--svg", str(tmp_path / "missing" / "t.svg")]) == 2
    assert "cannot write" in capsys.readouterr().err


# ---------------------------------------------------------------- a two-node host


def two_node_switch_host(root: Path, *, mixed: bool = False) -> Path:
    """Node 0: root port 00:01.0 -> switch (01:00.0 up; 02:00.0, 02:01.0 down) -> GPUs 03:00.0
    (+ audio .1) and 04:00.0. Node 1: root ports 80:01.0 and 80:02.0 -> GPUs 81:00.0, 82:00.0.
    Every GPU ready; ``mixed``: 04:00.0 without a reset (ready, with warnings) and 81:00.0 the
    boot display (not ready)."""
    fake = FakeHost(root)
    port = {"cls": 0x060400, "vendor": 0x10B5, "device": 0xC010, "driver": "pcieport"}
    fake.pci("0000:00:01.0", group=1, numa_node=0, **port)  # type: ignore[arg-type]
    fake.pci("0000:01:00.0", parent="0000:00:01.0", group=2, numa_node=0, **port)  # type: ignore[arg-type]
    for n, (down, gpu) in enumerate((("0000:02:00.0", "0000:03:00.0"), ("0000:02:01.0", "0000:04:00.0"))):
        fake.pci(down, parent="0000:01:00.0", group=3 + n, numa_node=0, **port)  # type: ignore[arg-type]
        reset = "" if mixed and n else "flr bus"
        fake.pci(gpu, cls=0x030200, parent=down, group=10 + n, numa_node=0, driver="nvidia", reset=reset)
    fake.pci(
        "0000:03:00.1", cls=0x040300, parent="0000:02:00.0", group=10, numa_node=0, driver="snd_hda_intel", device=1
    )
    for n in (1, 2):
        fake.pci(f"0000:80:0{n}.0", group=20 + n, numa_node=1, **port)  # type: ignore[arg-type]
        fake.pci(
            f"0000:8{n}:00.0",
            cls=0x030200,
            parent=f"0000:80:0{n}.0",
            group=30 + n,
            numa_node=1,
            driver="vfio-pci",
            boot_vga=mixed and n == 1,
        )
    add_numa(fake, [("0-15", 64 * GIB_KIB, {}), ("16-31", 64 * GIB_KIB, {})])
    return fake.finish()


def test_two_numa_nodes_each_with_their_gpus(tmp_path, capsys) -> None:
    document = topology(capsys, two_node_switch_host(tmp_path / "root"))
    jsonschema.validate(document, SCHEMA)
    assert [(n["node"], n["cpulist"]) for n in document["numa_nodes"]] == [(0, "0-15"), (1, "16-31")]
    placed = placements(document)
    down = [("root port", "0000:00:01.0"), ("switch upstream port", "0000:01:00.0")]
    assert placed == {
        "0000:03:00.0": (0, [*down, ("switch downstream port", "0000:02:00.0")]),
        "0000:04:00.0": (0, [*down, ("switch downstream port", "0000:02:01.0")]),
        "0000:81:00.0": (1, [("root port", "0000:80:01.0")]),
        "0000:82:00.0": (1, [("root port", "0000:80:02.0")]),
    }
    # The switch is drawn once, with both downstream ports below it.
    (bus0,) = document["numa_nodes"][0]["root_buses"]
    (root_port,) = bus0["children"]
    (upstream,) = root_port["children"]
    assert [c["address"] for c in upstream["children"]] == ["0000:02:00.0", "0000:02:01.0"]


def test_unreadable_groups_are_unknown_never_alone(tmp_path, capsys, monkeypatch) -> None:
    root = two_node_switch_host(tmp_path / "root")
    shutil.rmtree(root / "sys/kernel/iommu_groups")
    document = topology(capsys, root)
    for gpu in gpus_in(document):
        assert gpu["unknown"] == ["unknown: IOMMU groups could not be read (/sys/kernel/iommu_groups: absent)"]
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["topology", "--root", str(root)]) == 0
    assert capsys.readouterr().out.count("unknown: IOMMU groups could not be read") == 4
    assert render_svg(document).count("unknown: IOMMU groups could not be read") == 4


# ---------------------------------------------------------------- untrusted values

HOSTILE_NAME = "<script>alert(1)</script> \x1b[2J&amp;"
HOSTILE_DRIVER = "<img src=x onerror=alert(2)>"


def hostile_host(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    text = f'# pci.ids\n10de  {HOSTILE_NAME}\n\t2330  GPU "quoted" ]]>\n'
    monkeypatch.setattr(names.HwdbIds, "load", lambda *a, **k: None)  # the names come from this pci.ids
    monkeypatch.setattr(names.PciIds, "load", lambda *a, **k: names.PciIds(text))
    fake = FakeHost(root)
    fake.pci("0000:00:01.0", cls=0x060400, vendor=0x8086, device=0x2345, driver="pcieport", group=1)
    fake.pci("0000:01:00.0", cls=0x030200, parent="0000:00:01.0", group=5, driver=HOSTILE_DRIVER)
    fake.pci("0000:01:00.1", cls=0x040300, parent="0000:00:01.0", group=5, driver="snd_hda_intel", device=0x10F1)
    return fake.finish()


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.update(name for name, _ in attrs)


def test_host_values_never_become_markup(tmp_path, capsys, monkeypatch) -> None:
    root = hostile_host(tmp_path / "root", monkeypatch)
    svg, page = tmp_path / "t.svg", tmp_path / "t.html"
    assert main(["topology", "--root", str(root), "--svg", str(svg)]) == 0
    assert main(["topology", "--root", str(root), "--html", str(page)]) == 0
    assert capsys.readouterr().out == f"wrote {svg}: 1 GPU\nwrote {page}: 1 GPU\n"
    document = topology(capsys, root)
    (gpu,) = gpus_in(document)
    assert gpu["name"].startswith(HOSTILE_NAME) and gpu["driver"] == HOSTILE_DRIVER  # JSON: the exact value

    for text in (svg.read_text(), page.read_text()):
        assert "<script" not in text and "<img" not in text and "\x1b" not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "&amp;amp;" in text
    # Well-formed XML whose text is the value as shown (the escape character made visible).
    drawn = " ".join(t.text or "" for t in ElementTree.parse(svg).iter(f"{SVG_NS}text"))
    assert "<script>alert(1)</script> \\x1b[2J&amp;" in drawn
    assert f"driver {HOSTILE_DRIVER}" in drawn
    parser = Tags()
    parser.feed(page.read_text())
    assert parser.tags <= {"html", "head", "meta", "title", "style", "body", "svg", "rect", "text", "path", "g"}
    assert not {a for a in parser.attrs if a.startswith("on")} and "src" not in parser.attrs

    monkeypatch.setenv("COLUMNS", "300")
    assert main(["topology", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "<script>alert(1)</script> \\x1b[2J" in out


# ---------------------------------------------------------------- the picture, in a browser


def browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        pytest.skip("chromium is not installed (scripts/bootstrap.sh test installs it)")
    return found


def screenshot(page: Path, out: Path, profile: Path) -> Path:
    subprocess.run(
        [
            browser(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--force-color-profile=srgb",
            f"--user-data-dir={profile}",
            f"--screenshot={out}",
            "--window-size=1200,800",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB or RGBA, non-interlaced PNG (stdlib only)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        previous = line
        rgb = line if channels == 3 else bytes(b for i, b in enumerate(line) if i % 4 != 3)
        rows.append(bytes(rgb))
    return width, height, rows


def regions(width: int, height: int, rows: list[bytes], colour: str, least: int = 200) -> list[tuple[int, int, int]]:
    """Connected areas of exactly ``colour`` (#rrggbb) of at least ``least`` pixels: (pixels, centre x, centre y)."""
    want = bytes.fromhex(colour[1:])
    hit = {(x, y) for y, row in enumerate(rows) for x in range(width) if row[3 * x : 3 * x + 3] == want}
    found = []
    while hit:
        stack = [hit.pop()]
        xs, ys = [], []
        while stack:
            x, y = stack.pop()
            xs.append(x)
            ys.append(y)
            for n in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if n in hit:
                    hit.remove(n)
                    stack.append(n)
        if len(xs) >= least:
            found.append((len(xs), sum(xs) // len(xs), sum(ys) // len(ys)))
    return sorted(found, key=lambda r: (r[1], r[2]))


def test_the_picture_in_a_browser_shows_each_gpu_in_its_node_column(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(names.HwdbIds, "load", lambda *a, **k: None)  # names as ids: the same width everywhere
    monkeypatch.setattr(names.PciIds, "load", lambda *a, **k: None)
    facts = gather(Sysfs(str(two_node_switch_host(tmp_path / "root", mixed=True))))
    document = build_topology(facts)
    verdicts = {g["address"]: g["verdict"] for g in gpus_in(document)}
    assert verdicts == {
        "0000:03:00.0": "ready",
        "0000:04:00.0": "ready, with warnings",
        "0000:81:00.0": "not ready",
        "0000:82:00.0": "ready",
    }
    page = tmp_path / "topology.html"
    page.write_text(render_html(document), encoding="utf-8")
    width, height, rows = read_png(screenshot(page, tmp_path / "shot.png", tmp_path / "profile"))
    assert (width, height) == (1200, 800)

    white = bytes((255, 255, 255))
    inked = sum(1 for row in rows for x in range(width) if row[3 * x : 3 * x + 3] != white)
    assert inked > width * height // 50, f"only {inked} non-white pixels: the page looks blank"

    # Each GPU box is where the SVG put it (the page's 16 px margin; scaled down when wider than the
    # window), in its verdict's colour, two in node 0's column on the left, two in node 1's on the right.
    svg = ElementTree.fromstring(render_svg(document, standalone=False))
    scale = min(1.0, (width - 32) / float(svg.get("width", "0")))
    columns = [screen(r, scale) for r in svg.iter(f"{SVG_NS}rect") if r.get("fill") == COLUMN_FILL]
    assert len(columns) == 2 and columns[0][0] < columns[1][0]
    split = (columns[0][0] + columns[1][0]) / 2

    def drawn_order(box: tuple[Any, ...]) -> tuple[bool, float]:
        """Node 0's column first, then node 1's; top to bottom in each."""
        return box[-5] > split, box[-4]

    expected = sorted(
        (
            (*screen(r, scale), r.get("fill"))
            for g in svg.iter(f"{SVG_NS}g")
            if g.get("class") == "gpu"
            for r in g.iter(f"{SVG_NS}rect")
        ),
        key=drawn_order,
    )
    assert [fill for *_, fill in expected] == [
        VERDICT_COLOURS[verdicts[a]][0] for a in ("0000:03:00.0", "0000:04:00.0", "0000:81:00.0", "0000:82:00.0")
    ]
    boxes = sorted(
        (
            (x, y, pixels, 0.0, fill)
            for fill in {fill for *_, fill in expected}
            for pixels, x, y in regions(width, height, rows, fill)  # the legend's squares: under 200 pixels
        ),
        key=drawn_order,
    )
    assert len(boxes) == len(expected) == 4, (boxes, expected)
    for (x, y, _, _, fill), (ex, ey, hw, _, efill) in zip(boxes, expected):
        # The centre of the coloured pixels: the text on a wide box pulls it off the box's own a little.
        assert abs(x - ex) <= 8 + hw / 10 and abs(y - ey) <= 8 and fill == efill, (boxes, expected)
    assert len(columns) == 2, columns
    for (cx, _, half_width, _), count in zip(columns, (2, 2)):
        assert len([b for b in boxes if abs(b[0] - cx) < half_width]) == count, (columns, boxes)

    # The legend: a square of each verdict's colour below the columns, the words beside it.
    bottom = max(c[1] + c[3] for c in columns)
    for fill, _stroke in VERDICT_COLOURS.values():
        squares = [r for r in regions(width, height, rows, fill, least=60) if r[0] < 200]
        assert len(squares) == 1 and squares[0][2] > bottom, (fill, squares, bottom)
    drawn = " ".join(t.text or "" for t in svg.iter(f"{SVG_NS}text"))
    for verdict in VERDICT_COLOURS:
        assert f"GPU {verdict}" in drawn
    # And the link matrix under it, as nvidia-smi topo -m names the links.
    assert "GPU0 0000:03:00.0  X     PIX   SYS   SYS" in drawn
    assert "GPU3 0000:82:00.0  SYS   SYS   PHB   X" in drawn


def screen(rect: ElementTree.Element, scale: float) -> tuple[float, float, float, float]:
    """Centre x, centre y, half width, half height of an SVG rect on the page."""
    x, y, w, h = (float(rect.get(k, "0")) for k in ("x", "y", "width", "height"))
    return 16 + (x + w / 2) * scale, 16 + (y + h / 2) * scale, w / 2 * scale, h / 2 * scale


def test_an_svg_file_opens_in_the_browser_too(tmp_path, host_root) -> None:
    """The boot display is red (not ready), the other GPU green, each with its legend square."""
    page = tmp_path / "t.svg"
    assert main(["topology", "--root", str(host_root("boot-vga")), "--svg", str(page)]) == 0
    width, height, rows = read_png(screenshot(page, tmp_path / "shot.png", tmp_path / "profile"))
    ready, not_ready = VERDICT_COLOURS["ready"][0], VERDICT_COLOURS["not ready"][0]
    assert len(regions(width, height, rows, ready)) == 1 and len(regions(width, height, rows, not_ready)) == 1
    (red,), (green,) = regions(width, height, rows, not_ready), regions(width, height, rows, ready)
    assert red[2] < green[2]  # 00:02.0 (the boot display) is drawn above 02:00.0


def test_a_picture_to_stdout_in_the_browser(tmp_path, host_root, capsys, monkeypatch) -> None:
    """`--html -` is the page itself on stdout (no file named '-'), and it draws."""
    monkeypatch.chdir(tmp_path)
    assert (
        main(["topology", "--root", str(host_root("gpu-bridge-nic")), "--device", "0000:02:01.0", "--html", "-"]) == 0
    )
    page = tmp_path / "t.html"
    page.write_text(capsys.readouterr().out, encoding="utf-8")
    assert not (tmp_path / "-").exists()
    width, height, rows = read_png(screenshot(page, tmp_path / "shot.png", tmp_path / "profile"))
    assert len(regions(width, height, rows, VERDICT_COLOURS["not ready"][0])) == 1  # its group has the host's NIC
