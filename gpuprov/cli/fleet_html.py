"""The fleet document (:mod:`gpuprov.report.fleet`) as one self-contained HTML page: a table of
the hosts, each with its status as a coloured badge, then per host its GPUs (use, verdict, health),
its drift (against which declared entry) and every reason it is not ready.

Hand-made HTML, no script, no dependency. Every value from a host is untrusted: it goes through
:func:`gpuprov.cli.textsafe.safe_text` (control characters shown as escapes) and then HTML
escaping, so a name holding ``<script>`` is text, never markup (docs/output.md); the page's
Content-Security-Policy forbids scripts and anything loaded from elsewhere.
"""

from __future__ import annotations

import html
from typing import Any

from ..report.fleet import has_record
from .textsafe import safe_text

# Each host status's badge colour: tests/cli/test_fleet_html.py finds the badges by these in a
# screenshot, so no other part of the page uses them.
STATUS_FILL = {
    "converged": "#2e7d32",
    "drifted": "#e6a100",
    "unknown": "#1565c0",
    "not ready": "#c62828",
    "unreachable": "#5f6b7a",
    "failed": "#7b1fa2",
}
HEALTH_FILL = {"ok": "#d7ecd9", "warn": "#fbe7b5", "fail": "#f6c6c6"}
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; script-src 'none'"

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; color: #1d2733; background: #ffffff; }
h1 { font-size: 20px; margin: 0 0 8px; }
h2 { font-size: 16px; margin: 24px 0 6px; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { border: 1px solid #c9d1db; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #eef2f6; }
.badge { display: inline-block; width: 110px; height: 24px; line-height: 24px; text-align: center;
         color: #ffffff; font-weight: 600; border-radius: 3px; }
.health { padding: 1px 6px; border-radius: 3px; }
.muted { color: #5b6775; }
ul { margin: 2px 0 8px 18px; padding: 0; }
code { font-size: 13px; }
"""


def esc(value: object) -> str:
    """A value from a host as HTML text: control characters made visible, then escaped."""
    return html.escape(safe_text("" if value is None else value), quote=True)


def badge(status: str) -> str:
    fill = STATUS_FILL.get(status, "#000000")
    return f'<span class="badge" style="background: {fill}">{esc(status)}</span>'


def _items(rows: list[dict[str, Any]], with_entry: bool = True) -> str:
    if not rows:
        return '<p class="muted">none</p>'
    out = []
    for r in rows:
        entry = f' <span class="muted">[{esc(r["entry"])}]</span>' if with_entry and r.get("entry") else ""
        fix = f'<br><span class="muted">fix: {esc(r["fix"])}</span>' if r.get("fix") else ""
        out.append(f"<li><code>{esc(r.get('code'))}</code> {esc(r.get('message'))}{entry}{fix}</li>")
    return "<ul>" + "".join(out) + "</ul>"


def _gpus(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return '<p class="muted">no GPU</p>'
    rows = []
    for g in gpus:
        health = g["health"]
        said = "; ".join(f["message"] for f in health["findings"]) or "no problem read"
        rows.append(
            "<tr>"
            f"<td><code>{esc(g['address'])}</code></td><td>{esc(g['name'])}</td><td>{esc(g['driver'] or 'none')}</td>"
            f"<td>{esc(g['use'])}</td><td>{esc(g['entry'] or '')}</td><td>{esc(g['verdict'])}</td>"
            f'<td><span class="health" style="background: {HEALTH_FILL.get(health["status"], "#ffffff")}">'
            f"{esc(health['status'])}</span> {esc(said)}</td>"
            "</tr>"
        )
    names = ("GPU", "name", "driver", "use", "declared as", "verdict", "health")
    head = "<tr>" + "".join(f"<th>{n}</th>" for n in names) + "</tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def render_html(document: dict[str, Any]) -> str:
    s = document["summary"]
    summary = (
        f"{s['hosts']} hosts: {s['converged']} converged, {s['drifted']} drifted, {s['unknown']} unknown, "
        f"{s['not_ready']} not ready, "
        f"{s['unreachable']} unreachable, {s['failed']} failed; {s['gpus']} GPUs, {s['gpus_not_ready']} not ready, "
        f"{s['gpus_failing']} failing"
    )
    rows = []
    for i, h in enumerate(document["hosts"]):
        rows.append(
            f'<tr><td><a href="#host-{i}">{esc(h["host"])}</a></td><td>{badge(h["status"])}</td>'
            f"<td>{len(h.get('gpus') or [])}</td><td>{len(h['drift'])}</td><td>{len(h['not_ready'])}</td>"
            f"<td>{esc(h.get('message') or '')}</td></tr>"
        )
    table = (
        "<table><tr><th>host</th><th>status</th><th>GPUs</th><th>drift</th><th>not ready</th><th>message</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    sections = []
    for i, h in enumerate(document["hosts"]):
        parts = [f'<h2 id="host-{i}">{esc(h["host"])}: {esc(h["status"])}</h2>']
        if h.get("message"):
            parts.append(f"<p>{esc(h['message'])}</p>")
        if has_record(h):
            parts.append(
                f'<p class="muted">{esc(h.get("os") or "")} {esc(h.get("kernel") or "")} {esc(h.get("root") or "")}</p>'
            )
            parts.append(_gpus(h.get("gpus") or []))
            parts.append("<h3>not ready</h3>" + _items(h["not_ready"]))
            parts.append("<h3>drift</h3>" + _items(h["drift"]))
            if h.get("unknown"):
                unknown = "".join(f"<li>{esc(u['what'])}: {esc(u['why'])}</li>" for u in h["unknown"])
                parts.append(f'<h3>not compared</h3><ul class="muted">{unknown}</ul>')
        sections.append("".join(parts))
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>gpuprov fleet report</title><style>{STYLE}</style></head><body>"
        f"<h1>gpuprov fleet report</h1><p>{esc(summary)}</p>{table}{''.join(sections)}</body></html>\n"
    )
