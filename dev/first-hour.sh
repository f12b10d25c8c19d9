#!/usr/bin/env bash
# A newcomer's first hour, walked by a script (issue #50): a clone of this checkout in a fresh home
# with the system's PATH only (no venv, no pyenv), the README's install block run as written (its
# commands are read from README.md, so the two cannot drift), then from another directory: the
# playbook found by FQCN, gpuprov on a shipped capture (inspect, init, plan of the example
# inventory), and a fleet dry run over a staged capture. Prints each step's time and the total.
#
#   dev/first-hour.sh            # on a Debian 12 / Ubuntu machine, as root or with sudo
#
# It installs pipx and python3-venv with apt (the README's first line) and pulls ansible-core from
# PyPI; everything else stays below a temporary folder it removes. Exit 1 on the first step that fails.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/gpuprov-first-hour.XXXXXX)
trap 'rm -rf "$work"' EXIT
export HOME=$work/home PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
unset VIRTUAL_ENV PYTHONPATH ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH PIP_REQUIRE_VIRTUALENV
mkdir -p "$HOME"
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  git clone -q "$repo" "$work/gpuprov"
  # What is not committed is in no user's clone, but it is what this walk must check.
  (cd "$repo" && git ls-files -m -o --exclude-standard -z) | (cd "$repo" && xargs -0r cp --parents -t "$work/gpuprov")
else  # a checkout without its .git (an exported tree): the tree as it is, without what a build left
  mkdir "$work/gpuprov"
  tar -C "$repo" --exclude=./.venv --exclude=./.venv-system --exclude=./build -cf - . | tar -C "$work/gpuprov" -xf -
fi

total=0
step() {  # step NAME -- COMMAND...: run it, print its time
  local name=$1 start end
  shift
  start=$(date +%s.%N)
  if ! "$@" >"$work/step.log" 2>&1; then
    echo "FAILED: $name"
    tail -n 30 "$work/step.log"
    exit 1
  fi
  end=$(date +%s.%N)
  total=$(python3 -c "print($total + $end - $start)")
  printf '%7.1f s  %s\n' "$(python3 -c "print($end - $start)")" "$name"
}

# The README's install block: the console block under "## Install", each "$ " line as written.
python3 - "$repo/README.md" >"$work/install.sh" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text.split("\n## Install\n", 1)[1]
block = re.search(r"```console\n(.*?)```", section, re.S).group(1)
print("set -euo pipefail")
for line in block.splitlines():
    if line.startswith("$ "):
        command = line[2:]
        if __import__("os").geteuid() == 0:
            command = re.sub(r"^sudo ", "", command)
        print(command)
PY
cd "$work/gpuprov"
step "README install block ($(grep -c . "$work/install.sh") lines)" bash "$work/install.sh"
export PATH="$HOME/.local/bin:$PATH"

cd "$work"  # anywhere but the checkout: its ansible.cfg is not what a user has
captures=$work/gpuprov/tests/fixtures/hosts
example=$work/gpuprov/inventories/example
step "ansible-playbook gpuprov.kvm.gpu_passthrough --syntax-check" \
  ansible-playbook -i localhost, gpuprov.kvm.gpu_passthrough --syntax-check
step "gpuprov --version" gpuprov --version
step "gpuprov inspect (a capture)" gpuprov inspect --root "$captures/h100-live.tar.gz"
step "gpuprov init (a capture)" gpuprov init --root "$captures/h100-live.tar.gz"
for host in gpu-node-01 gpu-node-02; do  # each example against the capture shipped for it: it plans clean
  step "gpuprov plan -i the example inventory --host $host" \
    gpuprov plan --root "$work/gpuprov/inventories/example-captures/$host.tar.gz" -i "$example" --host "$host"
done
mkdir -p "$work/staged/h100"
tar -xzf "$captures/h100-live.tar.gz" -C "$work/staged/h100"
cat >"$work/fleet.yml" <<EOF
all:
  hosts:
    h100:
      ansible_connection: local
      ansible_python_interpreter: /usr/bin/python3
      gpuprov_root: $work/staged/h100
      gpuprov_host: {version: 1, gpus: [{name: gpu, address: "0000:00:06.0", use: host}]}
EOF
step "gpuprov fleet (a staged capture)" gpuprov fleet -i "$work/fleet.yml"
printf '%7.1f s  total\n' "$total"
