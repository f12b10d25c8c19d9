#!/usr/bin/env bash
# Issue 25's proof on a GPU guest of the device machines (no registry, no systemd: PID 1 is
# process_api): from a bare guest (no engine, no toolkit) the role guest_container_toolkit through
# ansible-playbook with an offline directory (Debian 12's Docker engine and what this guest lacks,
# made by scripts/offline-debs.sh --status from the guest's own dpkg status, plus the toolkit's
# .debs), then `gpuprov verify --bench --image` running a real GPU container.
#   dev/device/container-stage.sh park   # call 1: keep the .debs carried in .carry/debs (a call carries 64 MiB)
#   dev/device/container-stage.sh run    # call 2: the rest carried, then every step below; logs in $OUT
# Steps: check mode (/etc and dpkg's status hashed before and after), apply, a local image (the guest's
# python3 and glibc: `docker import`, nothing pulled), verify --bench --image, the role again (changed=0),
# and the no-op stage against a facts-only play, alternated.
set -uo pipefail
OUT=${OUT:-/tmp/container-stage}
PARK=/var/cache/gpuprov-device-debs
mkdir -p "$OUT" "$PARK"
if [[ ${1:-} == park ]]; then
  cp .carry/debs/*.deb "$PARK"/ && ls -la "$PARK"
  exit 0
fi
cp .carry/debs/*.deb "$PARK"/
offline=/root/offline-debs
rm -rf "$offline" && mkdir -p "$offline" && cp "$PARK"/*.deb "$offline"/
ls "$offline" > "$OUT/offline-dir.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/build/collections
printf '[defaults]\n' >"$OUT/ansible.cfg"
export ANSIBLE_CONFIG=$OUT/ansible.cfg ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
PY=$(command -v python3)
cat >"$OUT/inventory.yml" <<INV
gpu_guests:
  hosts:
    localhost:
      ansible_connection: local
      ansible_python_interpreter: $PY
      guest_container_toolkit_offline_dir: $offline
INV
snapshot() { find /etc /var/lib/dpkg/status -xdev -type f 2>/dev/null | sort | xargs -r sha256sum 2>/dev/null | sha256sum; }
play() {
  local name=$1
  shift
  local start=$SECONDS
  python3 -m ansible.cli.playbook -i "$OUT/inventory.yml" playbooks/guests.yml "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: rc=$? $((SECONDS - start))s: $(grep -E '^localhost +:' "$OUT/$name.log" | tail -1)"
}
{
  echo "bare: dockerd=$(command -v dockerd || echo none) nvidia-ctk=$(command -v nvidia-ctk || echo none) pid1=$(cat /proc/1/comm)"
  echo "etc before: $(snapshot)"
  play check --tags containers --check --diff
  echo "etc after check: $(snapshot)"
  play toolkit --tags containers
  echo "etc after toolkit: $(snapshot)"
  docker_info=$(docker info --format '{{.ServerVersion}} runtimes={{json .Runtimes}} cgroup={{.CgroupDriver}}' 2>&1)
  echo "docker: $docker_info"
  grep -A3 nvidia-container-runtime] /etc/nvidia-container-runtime/config.toml | head -4
  cat /etc/docker/daemon.json
  # A local image: the guest's own python3 and glibc (the bench mounts the guest's torch into it).
  img=/tmp/bench-rootfs
  rm -rf $img && mkdir -p $img/usr/bin $img/usr/lib $img/lib64 $img/etc $img/tmp
  cp -a /usr/bin/python3.12 $img/usr/bin/ && ln -s python3.12 $img/usr/bin/python3
  cp -a /usr/lib/python3.12 $img/usr/lib/
  mkdir -p $img/usr/lib/x86_64-linux-gnu && cp -a /usr/lib/x86_64-linux-gnu/*.so* $img/usr/lib/x86_64-linux-gnu/ 2>/dev/null
  cp -a /lib64/ld-linux-x86-64.so.2 $img/lib64/ 2>/dev/null
  ln -s usr/lib $img/lib && ln -s usr/bin $img/bin
  cp /etc/passwd /etc/group /etc/ld.so.conf $img/etc/ && cp -a /etc/ld.so.conf.d $img/etc/ 2>/dev/null
  t0=$SECONDS
  tar -C $img -c . | docker import - gpuprov-bench:local >/dev/null && echo "image gpuprov-bench:local in $((SECONDS - t0))s: $(docker image ls gpuprov-bench:local --format '{{.Size}}')"
  t0=$SECONDS
  python3 -m gpuprov verify --bench --image gpuprov-bench:local --json >"$OUT/verify-bench.json" 2>"$OUT/verify-bench.err"
  echo "verify --bench --image: rc=$? $((SECONDS - t0))s"
  COLUMNS=100 python3 -m gpuprov verify --image gpuprov-bench:local >"$OUT/verify.txt" 2>&1
  echo "verify (table): rc=$?"
  python3 - "$OUT/verify-bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for c in r["checks"]:
    if c["id"] in ("container-run", "bench-container", "bench-h2d", "bench-d2h", "bench-matmul", "docker-runtime", "cdi-spec"):
        print(c["status"], c["id"], c["message"])
print("summary", r["summary"])
PY
  docker run --rm --runtime=nvidia --network=none -e NVIDIA_VISIBLE_DEVICES=all \
    -e PATH=/usr/local/nvidia/bin:/usr/bin:/bin gpuprov-bench:local nvidia-smi -L
  echo "containers left: $(docker ps -aq | wc -l)"
  play toolkit-again --tags containers
  echo "etc after toolkit-again: $(snapshot)"
  # A GPU host keeps some GPUs for its own containers (issue 25): the spec then holds only those.
  first=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | sed 's/^0000//' | tr 'A-F' 'a-f')
  if [[ $(nvidia-smi -L | wc -l) -gt 1 ]]; then
    play host-keeps --tags containers -e "{\"guest_container_toolkit_cdi_gpus\": [\"$first\"]}"
    play host-keeps-again --tags containers -e "{\"guest_container_toolkit_cdi_gpus\": [\"$first\"]}"
    echo "host keeps $first: spec devices: $(python3 -c 'import json; print([d["name"] for d in json.load(open("/etc/cdi/nvidia.yaml"))["devices"]])')"
    echo "host keeps $first: a container sees:"
    docker run --rm --runtime=nvidia --network=none -e NVIDIA_VISIBLE_DEVICES=all \
      -e PATH=/usr/local/nvidia/bin:/usr/bin:/bin gpuprov-bench:local nvidia-smi -L
    play every-gpu-again --tags containers -e '{"guest_container_toolkit_cdi_gpus": null}'
  fi
} 2>&1 | tee "$OUT/summary.txt"

# The no-op stage against a facts-only play, alternated (issue 14's method): 3 rounds.
source dev/device/noop-ratio.sh
noop_ratio 3 "container stage (--tags containers)" playbooks/guests.yml --tags containers
# What comes back from a device call: at most 8 files; the logs go as one tarball.
tar -C "$OUT" -czf "$OUT/../container-stage-logs.tgz" . && mv "$OUT/../container-stage-logs.tgz" "$OUT/"
