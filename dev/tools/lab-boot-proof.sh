#!/usr/bin/env bash
# The lab host's boot pieces, shown for real on a running lab host (issue 16's lab side;
# docs/development/lab.md "Boot trials in the lab"): each proof prints what it saw and the
# seconds each boot took, and exits non-zero on the first thing that is not as it should be.
#
#   dev/tools/lab-boot-proof.sh grub          # lab up with the default image (GRUB)
#   dev/tools/lab-boot-proof.sh watchdog      # either image
#   dev/tools/lab-boot-proof.sh systemd-boot  # lab up --loader systemd-boot
#
# GPUPROV_CACHE and GPUPROV_LAB_PORT as for `python -m dev.lab`; PYTHON (default .venv's or
# python3) runs it. The proofs change the lab host's boot state and put it back; they reboot
# it 2-3 times (about 40-60 s each under TCG).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
TRIAL_ARG=gpuprov.trial=1

lab() { "$PYTHON" -m dev.lab ssh "$@"; }
say() { echo "proof: $*"; }
fail() { echo "proof: FAILED: $*" >&2; exit 1; }
boot_id() { lab cat /proc/sys/kernel/random/boot_id; }
run_dir() { "$PYTHON" -m dev.lab status --json | "$PYTHON" -c 'import json, os, sys; print(os.path.dirname(json.load(sys.stdin)["console"]))'; }

# Wait until SSH answers with another boot id than $1; prints the seconds waited.
wait_new_boot() {
    local old=$1 limit=${2:-600} t0=$SECONDS id
    while (( SECONDS - t0 < limit )); do
        id=$(lab cat /proc/sys/kernel/random/boot_id 2>/dev/null) || id=
        if [[ -n $id && $id != "$old" ]]; then echo $((SECONDS - t0)); return 0; fi
        sleep 2
    done
    fail "no new boot within $limit s"
}

# Reboot (systemctl reboot) and wait for the next boot; says how long it took.
reboot_wait() {
    local old secs
    old=$(boot_id)
    lab systemctl reboot || true
    secs=$(wait_new_boot "$old")
    say "rebooted: SSH back after $secs s"
}

cmdline() { lab cat /proc/cmdline; }

proof_grub() {
    say "GRUB: \$prefix and the environment block on the root disk"
    lab 'test -s /boot/grub/grubenv && ls /boot/grub/x86_64-efi/loadenv.mod && grub-editenv list' || fail "no grubenv or modules"
    # A one-shot entry: Debian's 41_custom sources /boot/grub/custom.cfg at boot (no update-grub).
    lab "set -e; k=\$(uname -r); args=\$(sed 's/^BOOT_IMAGE=[^ ]* //' /proc/cmdline)
         cat > /boot/grub/custom.cfg <<EOF
menuentry 'gpuprov trial' --id gpuprov-trial {
    linux /boot/vmlinuz-\$k \$args $TRIAL_ARG
    initrd /boot/initrd.img-\$k
}
EOF
         grub-reboot gpuprov-trial; grub-editenv list"
    lab grub-editenv list | grep -qx 'next_entry=gpuprov-trial' || fail "grub-reboot wrote no next_entry"
    reboot_wait
    cmdline | grep -qw "$TRIAL_ARG" || fail "the trial entry did not boot: $(cmdline)"
    say "trial boot: /proc/cmdline = $(cmdline)"
    lab grub-editenv list | grep -qx 'next_entry=gpuprov-trial' && fail "next_entry not consumed"
    say "grubenv after the trial boot (GRUB's save_env consumed next_entry): $(lab grub-editenv list | tr '\n' ' ')"
    reboot_wait
    cmdline | grep -qw "$TRIAL_ARG" && fail "the trial entry booted twice"
    say "next boot, the default again: /proc/cmdline = $(cmdline)"
    lab rm -f /boot/grub/custom.cfg
    say "GRUB: OK"
}

# Lines of run/watchdog.log that start (after the time stamp) with $2.
resets() { if [[ -f $1 ]]; then grep -c "^[^ ]* $2" "$1" || true; else echo 0; fi; }

proof_watchdog() {
    local log old t0 secs n
    log="$(run_dir)/watchdog.log"
    n=$(resets "$log" guest-watchdog:)
    say "i6300esb: armed, then stopped with the magic close ('V'): no reset"
    old=$(boot_id)
    # (udev loads i6300esb at boot with its default heartbeat, 30 s: reload it to be sure.)
    lab "modprobe -r i6300esb; modprobe i6300esb heartbeat=30 && grep -x 'i6300ESB timer' /sys/class/watchdog/watchdog0/identity &&
         sh -c 'echo x > /dev/watchdog' && printf V > /dev/watchdog"
    sleep 90
    [[ $(boot_id) == "$old" ]] || fail "the machine was reset although the watchdog was stopped"
    say "still the same boot after 90 s"
    say "i6300esb: armed (heartbeat=30), closed without 'V': the machine resets by itself"
    old=$(boot_id)
    t0=$SECONDS
    lab "sh -c 'echo x > /dev/watchdog'"
    while (( $(resets "$log" guest-watchdog:) <= n )); do
        (( SECONDS - t0 < 300 )) || fail "no watchdog reset within 300 s"
        sleep 1
    done
    say "reset $((SECONDS - t0)) s after arming (QMP WATCHDOG, run/watchdog.log: $(tail -n1 "$log"))"
    secs=$(wait_new_boot "$old")
    say "SSH back $secs s after the reset was seen"
    if (( $(resets "$log" lab-bmc:) )); then say "note: the lab's boot watchdog reset it too: $(grep lab-bmc: "$log")"; fi
    say "watchdog: OK"
}

proof_systemd_boot() {
    local entry trial
    say "systemd-boot: bootctl"
    lab bootctl status 2>&1 | grep -E 'Product:|ESP:|Current Entry:|Default Entry:|Secure Boot:' || true
    lab bootctl status 2>&1 | grep -q 'Product: systemd-boot' || fail "bootctl status names no systemd-boot"
    lab "echo machine-id: \$(cat /etc/machine-id); bootctl --print-esp-path; find $(lab bootctl --print-esp-path) -type f | sort"
    lab bootctl list
    entry=$(lab "ls /boot/efi/loader/entries/\$(cat /etc/machine-id)-\$(uname -r).conf") || fail "no entry for the running kernel"
    trial=/boot/efi/loader/entries/gpuprov-trial.conf
    # A copy of the default entry with one more argument and a sort-key of its own: a verbatim
    # copy (same sort-key, same version) is ordered by its file name against
    # <machine-id>-<kver>, and "gpuprov-trial" beats a machine-id that starts with a-f, which
    # would make the copy the default entry. It stays in place until after the next boot, so
    # that boot shows the default is still the original once the one-shot is spent (what a
    # fallback after a hang relies on).
    lab "sed -e 's/^title .*/title gpuprov trial/' -e 's/^sort-key .*/sort-key   gpuprov-trial/' \\
             -e 's/^options .*/& $TRIAL_ARG/' $entry > $trial && cat $trial"
    lab bootctl list | grep -q 'title: Debian.*(default)' || fail "the copy took the default entry's place"
    lab bootctl set-oneshot gpuprov-trial.conf
    # bootctl list marks the one-shot entry "(default)" now: the one the next boot takes.
    lab bootctl list | grep -E 'title|id:' || true
    reboot_wait
    cmdline | grep -qw "$TRIAL_ARG" || fail "the trial entry did not boot: $(cmdline)"
    say "trial boot: /proc/cmdline = $(cmdline)"
    lab bootctl list | grep -q 'title: Debian.*(default)' || fail "the one-shot is not spent"
    say "default entry's options from /etc/kernel/cmdline (kernel-install add)"
    lab "set -e; cp /etc/kernel/cmdline /root/cmdline.orig; sed -i 's/\$/ gpuprov.cmdline=1/' /etc/kernel/cmdline
         kernel-install add \$(uname -r) /boot/vmlinuz-\$(uname -r) /boot/initrd.img-\$(uname -r)
         grep ^options $entry" | grep -qw gpuprov.cmdline=1 || fail "kernel-install did not change the entry's options"
    reboot_wait
    cmdline | grep -qw "$TRIAL_ARG" && fail "the trial entry booted twice"
    cmdline | grep -qw gpuprov.cmdline=1 || fail "the default entry did not boot the new options"
    say "next boot, the default entry with the new options: /proc/cmdline = $(cmdline)"
    lab "set -e; rm $trial; mv /root/cmdline.orig /etc/kernel/cmdline
         kernel-install add \$(uname -r) /boot/vmlinuz-\$(uname -r) /boot/initrd.img-\$(uname -r)"
    say "systemd-boot: OK"
}

case ${1:-} in
    grub) proof_grub ;;
    watchdog) proof_watchdog ;;
    systemd-boot) proof_systemd_boot ;;
    *) echo "usage: $0 grub|watchdog|systemd-boot" >&2; exit 2 ;;
esac
