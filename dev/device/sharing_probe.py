"""Issue 48's hostile tenants on a GPU guest whose GPU is shared by MPS (dev/device/sharing-stage.sh):
containers started the documented way (the nvidia runtime, CDI) that ask for more than their share.

  python3 dev/device/sharing_probe.py hostile --image IMG --uuid GPU-... --share-mib N [--json OUT]

Runs, each as its own container, one after another (so each has the GPU to itself):
- ``plain``: the GPU by UUID, nothing asked: the share it gets alone;
- ``env``: the same with ``-e CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100``, ``-e
  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=140G`` and ``-e CUDA_MPS_PIPE_DIRECTORY=/tmp/elsewhere``: Docker's
  ``-e``, which CDI's environment overrides and the server's limits bind;
- ``env-alloc``: with those variables, asks for its memory share + 4 GiB;
- ``leaves-mps``: a process that sets ``CUDA_MPS_PIPE_DIRECTORY`` itself inside the container
  (before CUDA starts): MPS cannot hold what never connects to it; only compute mode
  Exclusive_Process refuses it (left Default here: the device machines' GPU settings are not ours).
Prints one line per run and writes every answer as JSON. Never changes a GPU setting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from gpuprov.facts.docker_api import find_engine, run_container
from gpuprov.verify import sharing_bench as sb

HOSTILE = {
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=140G",
    "CUDA_MPS_PIPE_DIRECTORY": "/tmp/elsewhere",
}


def _torch_site() -> str:
    import torch

    return os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["hostile"])
    ap.add_argument("--image", required=True)
    ap.add_argument("--uuid", required=True)
    ap.add_argument("--share-mib", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    engine = find_engine("/")
    if engine is None:
        print("no Docker engine", file=sys.stderr)
        return 2
    site = _torch_site()
    out: dict[str, object] = {}

    def one(name: str, tenant: sb.Tenant, argv: list[str]) -> None:
        t0 = time.monotonic()
        got = sb.run_tenants(engine, args.image, site, [tenant], lambda _t: argv, timeout=300)[tenant.name]
        out[name] = got
        print(f"{name}: {json.dumps(got)} ({time.monotonic() - t0:.0f} s)", flush=True)

    matmul = sb.throughput_argv(8192, args.seconds)
    one("plain", sb.Tenant("plain", args.uuid), matmul)
    one("env", sb.Tenant("env", args.uuid, dict(HOSTILE)), matmul)
    one("env-alloc", sb.Tenant("env-alloc", args.uuid, dict(HOSTILE)), ["alloc", "--mib", str(args.share_mib + 4096)])
    # A process that leaves MPS by itself: its own pipe folder, set inside the container, after CDI's.
    staged = sb.tempfile.mkdtemp(prefix="gpuprov-probe-")
    with open(os.path.join(staged, sb.SCRIPT), "w", encoding="utf-8") as f:
        f.write(sb.tenant_source())
    os.chmod(staged, 0o755)
    spec = sb._spec(args.image, site, staged, sb.Tenant("leaves-mps", args.uuid), matmul)
    leave = (
        "import os, runpy, sys; os.environ['CUDA_MPS_PIPE_DIRECTORY'] = '/tmp/elsewhere'; "
        "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    spec.argv = ["python3", "-c", leave, *spec.argv[1:]]
    t0 = time.monotonic()
    done = run_container(engine, spec, timeout=300)
    got = sb.last_json(done.output) or {"error": done.output.strip().splitlines()[-1:] or "no output"}
    out["leaves-mps"] = got
    print(f"leaves-mps: {json.dumps(got)} ({time.monotonic() - t0:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
