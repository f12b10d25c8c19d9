"""What a GPU's health (:mod:`gpuprov.facts.health`) says, for the fleet report: each finding
with a severity (``fail``: the GPU cannot be trusted with work now; ``warn``: look at it), a
message naming what was read, and a fix. The same Xids count as hardware ones as in
``gpuprov verify`` (:data:`gpuprov.verify.checks_multigpu.XID_HARDWARE`). Pure.
"""

from __future__ import annotations

from typing import Any

from ..facts.health import GpuHealth

FAIL, WARN = "fail", "warn"
# The Xids that say the hardware or its memory failed, as gpuprov verify's
# (gpuprov.verify.checks_multigpu.XID_HARDWARE; tests/facts/test_health.py holds the two the
# same). Not imported from there: this module ships to every host with the fleet report's
# module, and verify's checks bring the container and bench code with them.
XID_HARDWARE = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remap",
    64: "ECC page retirement or row remap failure",
    74: "NVLink error",
    79: "GPU fallen off the bus",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
KIND_WORDS = {"fatal": "fatal", "nonfatal": "non-fatal", "correctable": "correctable"}
RESET_FIX = "stop the GPU's jobs and VMs, reset it (or reboot the host); if it comes back, service the GPU"


def _finding(code: str, severity: str, message: str, fix: str | None) -> dict[str, Any]:
    return {"code": code, "severity": severity, "message": message, "fix": fix}


def _xids(h: GpuHealth) -> list[dict[str, Any]]:
    if not h.xids:
        return []
    counts: dict[int, int] = {}
    for e in h.xids:
        counts[e["xid"]] = counts.get(e["xid"], 0) + 1
    said = ", ".join(
        f"Xid {x}{' (' + XID_HARDWARE[x] + ')' if x in XID_HARDWARE else ''} x{n}" for x, n in sorted(counts.items())
    )
    if any(x in XID_HARDWARE for x in counts):
        return [
            _finding("xid-hardware", FAIL, f"{len(h.xids)} NVIDIA Xid event(s) in the kernel log: {said}", RESET_FIX)
        ]
    return [
        _finding(
            "xid",
            WARN,
            f"{len(h.xids)} NVIDIA Xid event(s) in the kernel log: {said}",
            "application Xids (13, 31, 43...): look at the jobs that ran; look each up in NVIDIA's Xid catalog",
        )
    ]


def _aer(h: GpuHealth) -> list[dict[str, Any]]:
    if not h.aer:
        return []
    out = []
    for kind, severity in (("fatal", FAIL), ("nonfatal", WARN), ("correctable", WARN)):
        total = h.aer.get(kind)
        if not total:
            continue
        names = ", ".join(f"{n} {c}" for n, c in sorted(h.aer_errors.get(kind, {}).items())[:6])
        out.append(
            _finding(
                f"aer-{kind}",
                severity,
                f"{total} {KIND_WORDS[kind]} PCIe error(s) (AER){': ' + names if names else ''}",
                RESET_FIX
                if kind == "fatal"
                else "reseat the GPU or its riser, check the slot's link (gpuprov inspect shows its speed and width)",
            )
        )
    return out


def _memory(h: GpuHealth) -> list[dict[str, Any]]:
    out = []
    ecc = h.ecc or {}
    counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in ecc.items() if v is not None)
    if ecc.get("volatile_uncorrected"):
        out.append(
            _finding("ecc-uncorrected", FAIL, f"uncorrected ECC errors since the driver loaded ({counts})", RESET_FIX)
        )
    elif ecc.get("aggregate_uncorrected"):
        out.append(
            _finding(
                "ecc-uncorrected-lifetime",
                WARN,
                f"uncorrected ECC errors in its lifetime ({counts})",
                "watch remapped rows and Xid 48/63/94/95",
            )
        )
    rows = h.remapped_rows or {}
    said = f"remapped rows: {rows.get('corrected')} corrected, {rows.get('uncorrected')} uncorrected"
    if rows.get("failure"):
        out.append(
            _finding("row-remap-failed", FAIL, f"row remapping failed ({said})", "service the GPU: no spare rows left")
        )
    elif rows.get("pending"):
        out.append(
            _finding(
                "row-remap-pending",
                WARN,
                f"a row remap is pending ({said})",
                "reset the GPU (a host-side reset for a passthrough guest) so the remap takes effect",
            )
        )
    return out


def judge(h: GpuHealth) -> list[dict[str, Any]]:
    """Every health finding of one GPU, the worst first."""
    out: list[dict[str, Any]] = []
    if not h.present:
        out.append(
            _finding(
                "gone",
                FAIL,
                f"{h.address} is not on the PCI bus",
                "look at the kernel log for the GPU falling off the bus or a removal; power-cycle the host",
            )
        )
    if h.config == "all-ones":
        out.append(
            _finding(
                "off-the-bus",
                FAIL,
                "its PCI config space reads all ones (ffff:ffff): the GPU fell off the bus and no longer answers",
                "power-cycle the host (a warm reboot may not bring it back); if it happens again, reseat or "
                "service the GPU",
            )
        )
    for event in h.driver_events:
        out.append(
            _finding(
                "driver-" + event["event"].replace(" ", "-"),
                FAIL,
                f"the NVIDIA driver says: {event['line']}",
                RESET_FIX,
            )
        )
    if h.resets:
        what = ", ".join(sorted({r["what"] for r in h.resets}))
        out.append(
            _finding(
                "reset-failed",
                FAIL,
                f"{len(h.resets)} failed reset(s) in the kernel log ({what}): {h.resets[-1]['line']}",
                "the GPU may not come back from a VM's shutdown: power-cycle the host; a GPU that fails its "
                "resets again needs service (docs/concepts/reset.md)",
            )
        )
    out += _aer(h) + _xids(h) + _memory(h)
    out.sort(key=lambda f: f["severity"] != FAIL)
    return out


def status(findings: list[dict[str, Any]]) -> str:
    """ok | warn | fail, from the findings."""
    if any(f["severity"] == FAIL for f in findings):
        return FAIL
    return WARN if findings else "ok"
