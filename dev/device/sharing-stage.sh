#!/usr/bin/env bash
# Issue 48's proof on a GPU guest of the device machines (no systemd: PID 1 is process_api; compute
# mode Default, and it stays so: the declarations say compute_mode: leave), after
# dev/device/container-stage.sh left Docker, the toolkit and the image gpuprov-bench:local:
#   dev/device/sharing-stage.sh four     # 4 equal tenants: check mode, apply, again (changed=0), verify --bench,
#                                        # a tenant that asks for more by its environment, drift repaired
#   dev/device/sharing-stage.sh two      # 2 tenants at 75/25 (advice) and at 50/50 (enforced) side by side,
#                                        # back to exclusive (no daemon, no folder)
#   dev/device/sharing-stage.sh bench    # dev/bench/sharing_bench.py (the GPU declared exclusive)
# Every log goes to $OUT; summary.txt is the record. Never changes a GPU setting.
set -uo pipefail
OUT=${OUT:-/tmp/sharing-stage}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/build/collections
printf '[defaults]\n' >"$OUT/ansible.cfg"
export ANSIBLE_CONFIG=$OUT/ansible.cfg ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 PYTHONUNBUFFERED=1
PY=$(command -v python3)
IMAGE=gpuprov-bench:local
ROOT=/run/gpuprov/mps
address=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-F' 'a-f' | sed 's/^0000\(....:\)/\1/')
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)

# declare NAME YAML-OF-THE-GPU-ENTRY: the inventory with gpuprov_guest holding that one entry.
declare_gpu() {
  cat >"$OUT/inventory.yml" <<INV
gpu_guests:
  hosts:
    localhost:
      ansible_connection: local
      ansible_python_interpreter: $PY
      gpuprov_guest:
        version: 1
        gpus:
          - $1
INV
  cp "$OUT/inventory.yml" "$OUT/inventory-$2.yml"
}
play() {
  local name=$1 start=$SECONDS
  shift
  python3 -m ansible.cli.playbook -i "$OUT/inventory.yml" playbooks/guests.yml --tags sharing "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: rc=$? $((SECONDS - start))s: $(grep -E '^localhost +:' "$OUT/$name.log" | tail -1)"
}
snapshot() { find /etc /run/gpuprov /usr/local/libexec/gpuprov -xdev -type f 2>/dev/null | sort | xargs -r sha256sum 2>/dev/null | sha256sum | cut -c1-16; }
daemons() { echo "daemons: $(pgrep -fa 'nvidia-cuda-mps|gpuprov-mps' | sed 's/^/[/; s/$/]/' | tr '\n' ' ')"; }
ask() { echo "$2" | CUDA_MPS_PIPE_DIRECTORY=$ROOT/$1/pipe timeout 10 nvidia-cuda-mps-control 2>&1 | tr '\n' ' '; }
verify() {
  local name=$1 t0=$SECONDS
  python3 -m gpuprov verify --bench --image "$IMAGE" --json >"$OUT/$name.json" 2>"$OUT/$name.err"
  echo "== $name: rc=$? $((SECONDS - t0))s"
  python3 - "$OUT/$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for c in r["checks"]:
    if c["id"].startswith("sharing") or c["id"] in ("container-run", "cdi-spec", "bench-matmul", "bench-container"):
        print(" ", c["status"], c["id"], c["message"])
print("  summary", r["summary"])
PY
}

# setup: what dev/device/container-stage.sh does, the least of it (the engine and toolkit from the offline
# directory parked by its "park" step, the local image), for a machine started fresh.
setup() {
  offline=/root/offline-debs
  rm -rf "$offline" && mkdir -p "$offline" && cp /var/cache/gpuprov-device-debs/*.deb "$offline"/
  printf 'gpu_guests:\n  hosts:\n    localhost:\n      ansible_connection: local\n      ansible_python_interpreter: %s\n      guest_container_toolkit_offline_dir: %s\n' \
    "$PY" "$offline" >"$OUT/inventory-setup.yml"
  python3 -m ansible.cli.playbook -i "$OUT/inventory-setup.yml" playbooks/guests.yml --tags containers >"$OUT/setup.log" 2>&1
  echo "== setup (containers): rc=$? $(grep -E '^localhost +:' "$OUT/setup.log" | tail -1)"
  local img=/tmp/bench-rootfs
  rm -rf $img && mkdir -p $img/usr/bin $img/usr/lib/x86_64-linux-gnu $img/lib64 $img/etc $img/tmp
  cp -a /usr/bin/python3.12 $img/usr/bin/ && ln -s python3.12 $img/usr/bin/python3
  cp -a /usr/lib/python3.12 $img/usr/lib/ && cp -a /usr/lib/x86_64-linux-gnu/*.so* $img/usr/lib/x86_64-linux-gnu/ 2>/dev/null
  cp -a /lib64/ld-linux-x86-64.so.2 $img/lib64/ 2>/dev/null
  ln -s usr/lib $img/lib && ln -s usr/bin $img/bin
  cp /etc/passwd /etc/group /etc/ld.so.conf $img/etc/ && cp -a /etc/ld.so.conf.d $img/etc/ 2>/dev/null
  tar -C $img -c . | docker import - "$IMAGE" >/dev/null && echo "image $IMAGE: $(docker image ls "$IMAGE" --format '{{.Size}}')"
}

case ${1:-} in
four)
  {
    [[ ${2:-} == setup ]] && setup
    echo "gpu: $address $uuid; $(nvidia-smi --query-gpu=name,memory.total,compute_mode,compute_cap,driver_version --format=csv,noheader)"
    echo "pid1: $(cat /proc/1/comm); unshare: $(command -v unshare); setsid: $(command -v setsid); $(command -v nvidia-cuda-mps-control)"
    declare_gpu "{name: gpu0, address: \"$address\", sharing: mps, tenants: 4, compute_mode: leave}" four
    echo "before: $(snapshot)"
    play four-check --check --diff
    echo "after check: $(snapshot)"
    daemons
    play four-apply
    echo "after apply: $(snapshot)"
    daemons
    echo "limits asked of the daemon: sm=$(ask gpu0 get_default_active_thread_percentage) mem=$(ask gpu0 'get_default_device_pinned_mem_limit 0')"
    ls -la $ROOT/gpu0 $ROOT/gpu0/pipe
    grep -E 'CUDA_MPS|/dev/shm' /etc/cdi/nvidia.yaml | sort | uniq -c
    tail -5 $ROOT/gpu0/log/supervisor.log
    # One tenant first: a container the documented way becomes an MPS client (a server starts for it);
    # when it does not, stop here with the evidence rather than spend the machine's time on the rest.
    site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
    timeout 120 docker run --rm --runtime=nvidia --network=none -e NVIDIA_VISIBLE_DEVICES="$uuid" \
      -e PYTHONPATH="$site" -v "$site:$site:ro" "$IMAGE" python3 -c \
      'import os, torch; x = torch.ones(1 << 20, device="cuda"); print("tenant sum", x.sum().item(), os.environ.get("CUDA_MPS_PIPE_DIRECTORY"), os.listdir("/dev/shm"))'
    echo "tenant rc=$?; servers after one tenant: $(ask gpu0 get_server_list)"
    if [[ -z $(ask gpu0 get_server_list | tr -d ' ') ]]; then
      echo "no MPS server started for the tenant: stopping here"
      tail -20 $ROOT/gpu0/log/*.log
      exit 1
    fi
    play four-again
    echo "after again: $(snapshot)"
    verify four-verify
    echo "servers: $(ask gpu0 get_server_list)"
    # A tenant that asks for more by its environment (docker -e), and one whose process leaves MPS itself.
    python3 dev/device/sharing_probe.py hostile --image "$IMAGE" --uuid "$uuid" --share-mib "$(python3 -c "
import json; r = json.load(open('/etc/gpuprov/guest-sharing.json')); print(r['gpus'][0]['server_limits']['memory_mib'])")" \
      --json "$OUT/four-hostile.json"
    # Drift: each repaired by the role.
    echo "-- drift: the control daemon killed (the supervisor starts it again)"
    pkill -KILL -x nvidia-cuda-mps || true
    sleep 4
    daemons
    play drift-killed
    echo "-- drift: limits changed by hand"
    ask gpu0 'set_default_active_thread_percentage 100'
    ask gpu0 'set_default_device_pinned_mem_limit 0 100G'
    echo "by hand: sm=$(ask gpu0 get_default_active_thread_percentage) mem=$(ask gpu0 'get_default_device_pinned_mem_limit 0')"
    play drift-limits
    echo "repaired: sm=$(ask gpu0 get_default_active_thread_percentage) mem=$(ask gpu0 'get_default_device_pinned_mem_limit 0')"
    echo "-- drift: the pipe folder removed"
    rm -rf $ROOT/gpu0/pipe
    play drift-pipe
    ls $ROOT/gpu0/pipe
    echo "-- drift: supervisor and daemon killed"
    pkill -KILL -f gpuprov-mps-gpu0 || true
    pkill -KILL -x nvidia-cuda-mps || true
    sleep 1
    daemons
    play drift-all
    daemons
    play drift-again
    python3 -m gpuprov verify --no-container --json >"$OUT/four-verify-after-drift.json" 2>&1
    echo "verify after drift: rc=$?"
  } 2>&1 | tee "$OUT/summary.txt"
  ;;
two)
  {
    [[ ${2:-} == setup ]] && setup
    declare_gpu "{name: gpu0, address: \"$address\", sharing: mps, compute_mode: leave, advisory_shares: true, tenants: [{name: big, sm_percent: 75, memory_mib: 61440}, {name: small, sm_percent: 25, memory_mib: 20480}]}" unequal
    play two-unequal
    daemons
    echo "limits: sm=$(ask gpu0 get_default_active_thread_percentage) mem=$(ask gpu0 'get_default_device_pinned_mem_limit 0')"
    verify two-unequal-verify
    declare_gpu "{name: gpu0, address: \"$address\", sharing: mps, compute_mode: leave, tenants: [{name: a, sm_percent: 50, memory_mib: 61440}, {name: b, sm_percent: 50, memory_mib: 61440}]}" equal
    play two-equal
    play two-equal-again
    verify two-equal-verify
    declare_gpu "{name: gpu0, address: \"$address\", sharing: exclusive}" exclusive
    play exclusive
    play exclusive-again
    daemons
    pgrep -f 'nvidia-cuda-mps-(control|server)' >/dev/null || python3 dev/bench/sharing_bench.py --image "$IMAGE" \
      --counts "${COUNTS:-4}" --sizes 1024,8192 --seconds 3 --lead 10 --json "$OUT/sharing-bench.json" \
      >"$OUT/sharing-bench.txt" 2>"$OUT/sharing-bench.err"
    echo "== sharing bench: rc=$?"
    cat "$OUT/sharing-bench.txt"
    echo "folder: $(ls -d $ROOT/gpu0 2>&1)"
    echo "script: $(ls /usr/local/libexec/gpuprov/ 2>&1)"
    echo "cdi MPS lines: $(grep -c CUDA_MPS /etc/cdi/nvidia.yaml)"
    echo "shm mounts: $(grep -c gpuprov /proc/self/mounts)"
  } 2>&1 | tee "$OUT/summary.txt"
  ;;
bench)
  {
    t0=$SECONDS
    python3 dev/bench/sharing_bench.py --image "$IMAGE" --seconds 3 --lead 10 --json "$OUT/sharing-bench.json" \
      >"$OUT/sharing-bench.txt" 2>"$OUT/sharing-bench.err"
    echo "== sharing bench: rc=$? $((SECONDS - t0))s"
    cat "$OUT/sharing-bench.txt"
    daemons
  } 2>&1 | tee "$OUT/summary.txt"
  ;;
*)
  echo "usage: $0 four|two|bench" >&2
  exit 2
  ;;
esac
