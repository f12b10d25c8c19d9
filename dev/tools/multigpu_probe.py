"""Dump every value verify's multi-GPU and health checks read, on this machine, to a JSON file:
the probe of gpuprov/facts/multigpu.py (NVML through pynvml, sysfs, this process's CPUs, the
kernel log's Xid lines) with each GPU's PCIe link, and with --bench the GPU-to-GPU copies.
The file is a test fixture as it is: tests/verify/test_verify_multigpu.py judges such files.

    PYTHONPATH=. python3 dev/tools/multigpu_probe.py --out probe.json [--bench] [--report verify.json]

--report also writes the `gpuprov verify --json` report made from the same reading, and
`nvidia-smi topo -m` / `topo -p2p r` are kept beside the values (to set the P2P matrix
against nvidia-smi's). Read-only, apart from --bench using the GPUs for a few seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpuprov.facts.sysfs import Sysfs
from gpuprov.report.verify import build_report
from gpuprov.verify.checks import evaluate
from gpuprov.verify.checks_multigpu import multigpu_probe
from gpuprov.verify.gather import gather


def smi(*args: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(nvidia-smi {' '.join(args)} failed: {exc})"
    return proc.stdout if proc.returncode == 0 else f"(exit {proc.returncode}) {proc.stdout}{proc.stderr}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the probe JSON")
    parser.add_argument("--bench", action="store_true", help="also measure GPU-to-GPU copies (torch or cupy)")
    parser.add_argument("--report", help="also write the verify report (gpuprov.verify/v1) here")
    args = parser.parse_args(argv)
    facts = gather(Sysfs("/"), run_container=False, engine=None, bench=args.bench)
    probe: dict[str, Any] | None = multigpu_probe(facts)
    if probe is None:
        print(f"no GPU seen here: {facts.gpu_error}", file=sys.stderr)
        return 1
    probe["bench_requested"] = args.bench
    probe["nvidia_smi_topo"] = {"m": smi("topo", "-m"), "p2p_r": smi("topo", "-p2p", "r")}
    Path(args.out).write_text(json.dumps(probe, indent=1) + "\n")
    checks = evaluate(facts)
    if args.report:
        Path(args.report).write_text(json.dumps(build_report(facts, checks), indent=1) + "\n")
    for c in checks:
        where = "" if c.gpu is None else f" (GPU {c.gpu})"
        print(f"{c.status:5} {c.id}{where}: {c.message}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
