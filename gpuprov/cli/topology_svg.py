"""The topology document (:mod:`gpuprov.report.topology`) as an SVG picture, or an HTML page
holding it: one column per NUMA node, an indented tree of boxes in each (root bus, ports,
GPU), each GPU's group members in a dashed frame with it, each GPU coloured by its verdict;
below them a legend of the colours and, with two GPUs or more, their link matrix as
``nvidia-smi topo -m`` prints it.

Hand-made SVG, no dependency. Every value from the host is untrusted: it goes through
:func:`gpuprov.cli.textsafe.safe_text` (control characters shown as escapes; XML allows
none of them) and then XML escaping, so a device name holding ``<script>`` is text, never
markup (docs/output.md). The HTML page also forbids scripts by its Content-Security-Policy.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

from ..report.topology import LINKS, NOT_READY, READY, UNKNOWN_VERDICT, WARNINGS
from .textsafe import safe_text
from .topology_labels import (
    RELATION_TEXT,
    device_label,
    gpu_column,
    gpu_details,
    matrix_title,
    node_title,
    verdict_line,
)

# Colours. A GPU's box is filled by its verdict (fill, stroke); the browser test looks for
# these in the screenshot (tests/cli/test_topology.py).
VERDICT_COLOURS = {
    READY: ("#76b900", "#3d6000"),
    WARNINGS: ("#f2c94c", "#8a6d00"),
    UNKNOWN_VERDICT: ("#b8a9e0", "#4b3d8f"),
    NOT_READY: ("#f28b82", "#a50e0e"),
}
GPU_FILL, GPU_STROKE = VERDICT_COLOURS[READY]
PORT_FILL, PORT_STROKE = "#dbe7f5", "#5b7fa6"
BUS_FILL, BUS_STROKE = "#eeeeee", "#8a8a8a"
MEMBER_FILL = {"companion": "#fde2c4", "bridge": "#eeeeee", "group member": "#f8c9c9"}
MEMBER_STROKE = {"companion": "#c77700", "bridge": "#8a8a8a", "group member": "#b3261e"}
COLUMN_FILL, COLUMN_STROKE = "#f6f8fb", "#9aa9bb"

FONT_PX, CHAR_PX, BOLD_WIDTH = 12, 7.3, 1.04  # monospace: a line's width is known before a browser draws it
LINE_PX, PAD, INDENT, GAP, MARGIN = 15, 8, 26, 10, 16
HEADER_PX, TITLE_CHAR_PX = 46, 10.2  # the title: 16 px bold
SWATCH_PX, MAX_LINE = 12, 72  # a legend's colour square; a box's line is cut here (the whole in its tooltip)
# XML 1.0 allows no C0 control but TAB/LF/CR, and not U+FFFE/U+FFFF: safe_text escapes the rest.
_NOT_XML = re.compile("[\ufffe\uffff]")


def text(value: object) -> str:
    """A host's value as SVG/HTML text: control characters made visible, then XML-escaped."""
    shown = _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", safe_text(value))
    return escape(shown)


@dataclass
class Box:
    depth: int
    lines: list[str]
    fill: str
    stroke: str
    kind: str  # bus | port | gpu | member
    parent: int | None  # index of the box it hangs from
    dashed: bool = False
    tip: str | None = None  # shown on hover: what a cut line says in full
    x: float = 0
    y: float = 0
    width: float = 0
    height: float = 0


@dataclass
class Column:
    title: str
    boxes: list[Box] = field(default_factory=list)
    groups: list[tuple[int, int, str]] = field(default_factory=list)  # first box, last box, label
    width: float = 0
    height: float = 0


def _column(node: dict[str, Any]) -> Column:
    col = Column(node_title(node))

    def add(box: Box) -> int:
        col.boxes.append(box)
        return len(col.boxes) - 1

    def walk(entries: list[dict[str, Any]], depth: int, parent: int) -> None:
        for e in entries:
            if e["kind"] == "port":
                group = "" if e["iommu_group"] is None else f", group {e['iommu_group']}"
                lines = [f"{e['role']} {e['address']} ({e['driver'] or 'no driver'}{group})", e["name"]]
                walk(e["children"], depth + 1, add(Box(depth, lines, PORT_FILL, PORT_STROKE, "port", parent)))
                continue
            reason = verdict_line(e)
            cut = reason if len(reason) <= MAX_LINE else reason[: MAX_LINE - 1] + "…"
            lines = [f"GPU {device_label(e)}", gpu_details(e), cut] + e["unknown"]
            fill, stroke = VERDICT_COLOURS.get(e.get("verdict") or UNKNOWN_VERDICT, VERDICT_COLOURS[UNKNOWN_VERDICT])
            reasons = [r for r in e.get("blockers") or e.get("warnings") or [] if r not in e["unknown"]]
            tip = "; ".join([e.get("verdict") or UNKNOWN_VERDICT, *reasons])
            gpu = add(Box(depth, lines, fill, stroke, "gpu", parent, tip=tip))
            for m in e["members"]:
                rel = m["relation"]
                lines = [f"{RELATION_TEXT[rel]}", f"{device_label(m)} ({m['driver'] or 'no driver'})"]
                add(Box(depth + 1, lines, MEMBER_FILL[rel], MEMBER_STROKE[rel], "member", gpu, dashed=rel == "bridge"))
            if e["members"]:
                label = "no IOMMU group" if e["iommu_group"] is None else f"IOMMU group {e['iommu_group']}"
                col.groups.append((gpu, len(col.boxes) - 1, label))

    for bus in node["root_buses"]:
        walk(bus["children"], 1, add(Box(0, [f"root bus {bus['bus']}"], BUS_FILL, BUS_STROKE, "bus", None)))
    return col


def _layout(document: dict[str, Any]) -> tuple[list[Column], float, float]:
    columns = [_column(n) for n in document["numa_nodes"]]
    x = MARGIN
    height = 0.0
    for col in columns:
        y = HEADER_PX + MARGIN + 28
        width = len(col.title) * CHAR_PX + 2 * PAD
        for box in col.boxes:
            bold = BOLD_WIDTH if box.kind == "gpu" else 1.0  # its first line is bold, a little wider
            box.width = max(len(box.lines[0]) * bold, *(len(line) for line in box.lines)) * CHAR_PX + 2 * PAD
            box.height = len(box.lines) * LINE_PX + PAD
            box.x = x + PAD + box.depth * INDENT
            box.y = y
            y += box.height + GAP
            width = max(width, box.x + box.width - x + PAD + 12)
        col.width, col.height = width, y - HEADER_PX - MARGIN + PAD
        x += width + MARGIN
        height = max(height, col.height)
    return columns, max(x, 420.0), HEADER_PX + MARGIN + height + MARGIN


def _legend_items() -> list[tuple[str, str, str, bool]]:
    """(label, fill, stroke, dashed) of each thing the picture colours."""
    items = [(f"GPU {verdict}", fill, stroke, False) for verdict, (fill, stroke) in VERDICT_COLOURS.items()]
    items += [("root bus", BUS_FILL, BUS_STROKE, False), ("port, switch, bridge", PORT_FILL, PORT_STROKE, False)]
    items += [(RELATION_TEXT[r], MEMBER_FILL[r], MEMBER_STROKE[r], r == "bridge") for r in MEMBER_FILL]
    items.append(("IOMMU group (dashed frame)", "none", "#c77700", True))
    return items


def _legend(x0: float, y0: float, width: float) -> tuple[list[str], float]:
    """The legend's SVG, flowed into rows of ``width``, and the height it takes."""
    out = [f'<g class="legend"><text x="{x0:.1f}" y="{y0 + 12:.1f}" font-weight="bold">Legend</text>']
    x, y = x0, y0 + LINE_PX + 6
    for label, fill, stroke, dashed in _legend_items():
        item = SWATCH_PX + 6 + len(label) * CHAR_PX + 18
        if x > x0 and x + item > x0 + width:
            x, y = x0, y + LINE_PX + 4
        dash = ' stroke-dasharray="3 2"' if dashed else ""
        out.append(
            f'<rect class="swatch" x="{x:.1f}" y="{y:.1f}" width="{SWATCH_PX}" height="{SWATCH_PX}" '
            f'fill="{fill}" stroke="{stroke}"{dash}/>'
        )
        out.append(f'<text x="{x + SWATCH_PX + 6:.1f}" y="{y + 10:.1f}">{text(label)}</text>')
        x += item
    out.append("</g>")
    return out, y + SWATCH_PX + 4 - y0


def _matrix_lines(document: dict[str, Any]) -> list[str]:
    """The link matrix as monospace lines (title, header, a row per GPU, the words used)."""
    matrix = document.get("link_matrix") or {}
    gpus = matrix.get("gpus") or []
    if len(gpus) < 2:
        return []
    label = max(len(f"{gpu_column(i)} {a}") for i, a in enumerate(gpus))
    cell = max(6, *(len(gpu_column(i)) + 2 for i in range(len(gpus))), *(len(c) + 2 for r in matrix["rows"] for c in r))
    lines = [matrix_title(matrix), " " * (label + 2) + "".join(gpu_column(i).ljust(cell) for i in range(len(gpus)))]
    for i, (address, row) in enumerate(zip(gpus, matrix["rows"])):
        lines.append(f"{gpu_column(i)} {address}".ljust(label + 2) + "".join(c.ljust(cell) for c in row))
    used = {c for row in matrix["rows"] for c in row}
    for word, meaning in LINKS.items():
        if word in used or (word == "NV#" and any(c.startswith("NV") for c in used)):
            lines.append(f"  {word:<4} {meaning}")
    return lines


def render_svg(document: dict[str, Any], *, standalone: bool = True) -> str:
    """The picture as an SVG document (``standalone``) or an ``<svg>`` element for a page."""
    columns, width, height = _layout(document)
    count = document["gpu_count"]
    title = f"PCI topology of {document['root']}: {count} GPU{'s' * (count != 1)}"
    matrix = _matrix_lines(document)
    width = max(
        width,
        len(safe_text(title)) * TITLE_CHAR_PX + 2 * MARGIN,
        max((len(safe_text(line)) for line in matrix), default=0) * CHAR_PX + 2 * MARGIN,
    )
    legend, legend_height = _legend(MARGIN, height, width - 2 * MARGIN)
    matrix_top = height + legend_height + MARGIN
    height = matrix_top + (len(matrix) * LINE_PX + MARGIN if matrix else 0)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" font-size="{FONT_PX}">',
        f"<title>{text(title)}</title>",
        f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
        f'<text x="{MARGIN}" y="{MARGIN + 14}" font-size="16" font-weight="bold">{text(title)}</text>',
    ]
    if not columns:
        out.append(f'<text x="{MARGIN}" y="{MARGIN + 40}">no GPU found (display class 0x03)</text>')
    for col in columns:
        left = col.boxes[0].x - PAD if col.boxes else MARGIN
        top = HEADER_PX + MARGIN
        out.append(
            f'<rect x="{left:.1f}" y="{top}" width="{col.width:.1f}" height="{col.height:.1f}" rx="6" '
            f'fill="{COLUMN_FILL}" stroke="{COLUMN_STROKE}"/>'
        )
        out.append(f'<text x="{left + PAD:.1f}" y="{top + 18}" font-weight="bold">{text(col.title)}</text>')
        for first, last, label in col.groups:
            a, b = col.boxes[first], col.boxes[last]
            right = max(col.boxes[i].x + col.boxes[i].width for i in range(first, last + 1))
            out.append(
                f'<rect x="{a.x - 5:.1f}" y="{a.y - 4:.1f}" width="{right - a.x + 10:.1f}" '
                f'height="{b.y + b.height - a.y + 8:.1f}" rx="5" fill="none" stroke="#c77700" '
                f'stroke-dasharray="5 3"><title>{text(label)}</title></rect>'
            )
        for box in col.boxes:
            if box.parent is not None:
                up = col.boxes[box.parent]
                x0, y0, y1 = up.x + 10, up.y + up.height, box.y + box.height / 2
                out.append(f'<path d="M{x0:.1f} {y0:.1f}V{y1:.1f}H{box.x:.1f}" fill="none" stroke="#555555"/>')
        for box in col.boxes:
            dash = ' stroke-dasharray="4 2"' if box.dashed else ""
            tip = f"<title>{text(box.tip)}</title>" if box.tip else ""
            out.append(
                f'<g class="{box.kind}">{tip}<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.width:.1f}" '
                f'height="{box.height:.1f}" rx="4" fill="{box.fill}" stroke="{box.stroke}"{dash}/>'
            )
            for i, line in enumerate(box.lines):
                weight = ' font-weight="bold"' if i == 0 and box.kind == "gpu" else ""
                out.append(
                    f'<text x="{box.x + PAD:.1f}" y="{box.y + PAD / 2 + 11 + i * LINE_PX:.1f}"{weight} '
                    f'xml:space="preserve">{text(line)}</text>'
                )
            out.append("</g>")
    out += legend
    if matrix:
        out.append('<g class="links">')
        for i, line in enumerate(matrix):
            weight = ' font-weight="bold"' if i == 0 else ""
            out.append(
                f'<text x="{MARGIN}" y="{matrix_top + 12 + i * LINE_PX:.1f}"{weight} '
                f'xml:space="preserve">{text(line)}</text>'
            )
        out.append("</g>")
    out.append("</svg>")
    body = "\n".join(out) + "\n"
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + body if standalone else body


def render_html(document: dict[str, Any]) -> str:
    """A small page holding the SVG; no script, no outside resource (its CSP forbids both)."""
    count = document["gpu_count"]
    title = f"gpuprov topology: {safe_text(document['root'])} ({count} GPU{'s' * (count != 1)})"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
        f"<title>{html.escape(title)}</title>\n"
        "<style>body{margin:16px;background:#ffffff;font-family:sans-serif}svg{max-width:100%;height:auto}</style>\n"
        "</head><body>\n" + render_svg(document, standalone=False) + "</body></html>\n"
    )
