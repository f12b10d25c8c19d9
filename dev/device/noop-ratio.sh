# Sourced by the device stage scripts: a stage with nothing to do against a facts-only play on the
# same guest, in the same run, alternated (issue 14's method), the medians and their ratio.
#   noop_ratio ROUNDS LABEL PLAYBOOK-ARGS...   (needs $OUT/inventory.yml; writes $OUT/noop-ratio.txt)
noop_ratio() {
  local rounds=$1 label=$2
  shift 2
  printf -- '- name: Facts only\n  hosts: gpu_guests\n  become: true\n  gather_facts: true\n  tasks: []\n' >"$OUT/facts.yml"
  local facts=() noop=() round
  for ((round = 1; round <= rounds; round++)); do
    facts+=("$(_timed "facts-$round" "$OUT/facts.yml")")
    noop+=("$(_timed "noop-$round" "$@")")
    echo "round $round: facts-only ${facts[-1]} s, no-op ${noop[-1]} s ($(grep -E '^localhost +:' "$OUT/noop-$round.log" | tail -1))" |
      tee -a "$OUT/summary.txt"
  done
  python3 - "${facts[*]}" "${noop[*]}" "$label" <<'PY' | tee "$OUT/noop-ratio.txt"
import statistics, sys
facts, noop = ([float(x) for x in arg.split()] for arg in sys.argv[1:3])
f, n = statistics.median(facts), statistics.median(noop)
print(f"facts-only play: {facts} s, median {f:.2f} s")
print(f"no-op {sys.argv[3]}: {noop} s, median {n:.2f} s")
print(f"ratio no-op / facts-only: {n / f:.2f} (goal: at most 2)")
PY
}

_timed() {
  local log=$1 t0 t1
  shift
  t0=$(date +%s.%N)
  python3 -m ansible.cli.playbook -i "$OUT/inventory.yml" "$@" >"$OUT/$log.log" 2>&1 || echo "== $log failed: $(tail -3 "$OUT/$log.log")" >&2
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.2f}')"
}
