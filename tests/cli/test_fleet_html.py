"""The fleet page (gpuprov/cli/fleet_html.py) drawn by headless Chromium and looked at, as the
topology picture is (tests/cli/test_topology.py): one badge per host in its status's colour, as many
of each colour as the document has hosts of that status, in the hosts' order down the table."""

from __future__ import annotations

from pathlib import Path

from gpuprov.cli.fleet_html import HEALTH_FILL, STATUS_FILL, render_html
from gpuprov.report.fleet import fleet_document, host_record, unanswered
from tests import fleethosts
from tests.cli.test_topology import read_png, regions, screenshot


def test_the_page_in_a_browser_shows_one_badge_per_host_in_its_status_colour(tmp_path: Path) -> None:
    assert len(set(STATUS_FILL.values()) | set(HEALTH_FILL.values())) == len(STATUS_FILL) + len(HEALTH_FILL)
    hosts = fleethosts.stage_fleet(tmp_path / "roots")
    records = {name: host_record(v["gpuprov_root"], {"gpuprov_host": v["gpuprov_host"]}) for name, v in hosts.items()}
    records["zz-gone"] = unanswered("zz-gone", "unreachable", "ssh: connect to host: Connection refused")
    records["zz-broken"] = unanswered("zz-broken", "failed", "MODULE FAILURE")
    records["zz-forged"] = {**records["pt-ok"], "gpus": "<script>"}  # an answer off the schema: unknown
    document = fleet_document(records)
    page = tmp_path / "fleet.html"
    page.write_text(render_html(document), encoding="utf-8")
    width, height, rows = read_png(screenshot(page, tmp_path / "shot.png", tmp_path / "profile"))

    found: dict[str, list[tuple[int, int, int]]] = {
        status: regions(width, height, rows, colour) for status, colour in STATUS_FILL.items()
    }
    counts = {status: len(boxes) for status, boxes in found.items()}
    want = {s: sum(1 for h in document["hosts"] if h["status"] == s) for s in STATUS_FILL}
    assert counts == want, (counts, want)
    assert want == {"converged": 3, "drifted": 3, "unknown": 1, "not ready": 2, "unreachable": 1, "failed": 1}
    # One column of badges, in the table's order (the hosts sorted by name), top to bottom.
    boxes = sorted((y, x, status) for status, found_ in found.items() for _n, x, y in found_)
    xs = [x for _y, x, _s in boxes]
    assert max(xs) - min(xs) <= 4, boxes  # centres: the text inside each badge moves them a pixel or two
    assert [s for _y, _x, s in boxes] == [h["status"] for h in document["hosts"]]
