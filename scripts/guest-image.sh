#!/usr/bin/env bash
# Build a small Debian 12 cloud-style guest image locally, from Debian packages
# only (no cloud image can be downloaded here): a debootstrap of Debian 12 with
# the stock kernel, cloud-init (NoCloud), openssh-server and ifupdown, as one
# ext4 filesystem on the whole disk (no partition table, no bootloader). The
# guest boots with libvirt's direct kernel boot from the image's own kernel:
#
#   <kernel>DIR/vmlinuz</kernel> <initrd>DIR/initrd.img</initrd> <cmdline>$(cat DIR/cmdline)</cmdline>
#
# Output (printed on stdout): DIR = ${GPUPROV_CACHE:-$HOME/.cache/gpuprov}/guest/<key>/ with
#   disk.qcow2   the base image (the VMs get qcow2 overlays on it; never written)
#   vmlinuz, initrd.img, cmdline, packages.txt (what is inside, with versions)
# key = hash of this script (suite and package list included): a change rebuilds,
# and older keys are removed. A cached image is reused as it is (0 s).
#
# The tests (tests/ansible/test_gpu_vms_libvirt.py) use it for the real libvirt run; it is
# also a quick guest for trying the gpu_vms role on a machine without cloud images.
#
# Environment: GPUPROV_CACHE, GPUPROV_DEBIAN_MIRROR (default http://deb.debian.org/debian).
# Needs root (debootstrap, chroot) when the image is not cached. debootstrap resolves no virtual
# packages: python3-cffi-backend is listed for python3-cryptography (cloud-init needs it). dbus:
# systemd-logind needs it to act on the ACPI power button (virsh shutdown).
set -euo pipefail

SUITE=bookworm
PACKAGES=(
  linux-image-amd64 initramfs-tools systemd-sysv udev kmod dbus
  cloud-init python3-cffi-backend openssh-server sudo ifupdown isc-dhcp-client iproute2 netbase ca-certificates
)
# The guest's kernel command line: root is the whole virtio disk.
CMDLINE="root=/dev/vda rw console=ttyS0,115200 net.ifnames=0 quiet"
MIRROR=${GPUPROV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/guest

self=$(readlink -f "${BASH_SOURCE[0]}")
lib=$(dirname "$self")/minbase.sh
# shellcheck source=scripts/minbase.sh
source "$lib"
key=$( (
  cat "$self" "$lib"
  echo "$SUITE ${PACKAGES[*]} $CMDLINE"
) | sha256sum | cut -c1-12)
out="$cache/$key"

log() { echo "guest-image.sh: $(date +%T) $*" >&2; }

if [[ -s $out/disk.qcow2 && -s $out/vmlinuz && -s $out/initrd.img ]]; then
  log "cached: $out"
  echo "$out"
  exit 0
fi
[[ $(id -u) -eq 0 ]] || {
  log "building the guest image needs root (debootstrap, chroot); nothing cached at $out"
  exit 1
}
for tool in debootstrap qemu-img mkfs.ext4; do
  command -v "$tool" >/dev/null 2>&1 || {
    log "missing $tool: apt-get install debootstrap qemu-utils e2fsprogs"
    exit 1
  }
done

start=$SECONDS
mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
rootfs="$work/rootfs"
cleanup() {
  local m
  for m in dev proc sys; do
    if mountpoint -q "$rootfs/$m" 2>/dev/null; then umount -l "$rootfs/$m" || true; fi
  done
  # Never rm -rf through a bind mount of the host's /dev.
  if grep -q " $rootfs/" /proc/mounts; then
    log "mounts left under $rootfs; not removing $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

log "debootstrap $SUITE minbase + ${#PACKAGES[@]} packages from $MIRROR (a few minutes)"
minbase_debootstrap "$SUITE" "$MIRROR" "$rootfs" "$work/debootstrap.log" "${PACKAGES[@]}" || exit 1
log "debootstrap done ($((SECONDS - start))s)"

# --- configuration: what a cloud image has --------------------------------
cat >"$rootfs/etc/fstab" <<'EOF'
/dev/vda / ext4 rw,errors=remount-ro 0 1
EOF
printf 'auto lo\niface lo inet loopback\n\nsource /etc/network/interfaces.d/*\n' >"$rootfs/etc/network/interfaces"
mkdir -p "$rootfs/etc/network/interfaces.d"
# cloud-init: NoCloud only (the seed ISO labelled cidata), fast host keys under TCG.
cat >"$rootfs/etc/cloud/cloud.cfg.d/90_gpuprov.cfg" <<'EOF'
datasource_list: [NoCloud, None]
ssh_genkeytypes: [ed25519, ecdsa]
EOF
# First boot makes its own identity.
: >"$rootfs/etc/machine-id"
rm -f "$rootfs/var/lib/dbus/machine-id" "$rootfs"/etc/ssh/ssh_host_* "$rootfs/etc/hostname"
# A small initramfs: only what finds a root on virtio (Debian's default takes "most" modules).
printf 'MODULES=list\nCOMPRESS=gzip\n' >"$rootfs/etc/initramfs-tools/conf.d/gpuprov.conf"
printf '%s\n' virtio_pci virtio_blk virtio_scsi virtio_net ext4 >>"$rootfs/etc/initramfs-tools/modules"
# No timers that would start apt or fstrim behind a test's back.
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
mount -t proc proc "$rootfs/proc"
mount -t sysfs sys "$rootfs/sys"
mount --bind /dev "$rootfs/dev"
chroot "$rootfs" update-initramfs -u -k all >"$work/initramfs.log" 2>&1 || {
  tail -n 20 "$work/initramfs.log" >&2
  exit 1
}
chroot "$rootfs" dpkg-query -W -f '${Package} ${Version}\n' >"$work/packages.txt"
umount -l "$rootfs/dev" "$rootfs/sys" "$rootfs/proc"

kver=$(basename "$(ls -d "$rootfs"/lib/modules/* | sort -V | tail -n1)")
cp "$rootfs/boot/vmlinuz-$kver" "$work/vmlinuz"
cp "$rootfs/boot/initrd.img-$kver" "$work/initrd.img"
# Trim: docs, man pages, locales, apt caches.
rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
  "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
  "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/debootstrap
find "$rootfs"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +

log "filesystem image"
mkfs.ext4 -q -F -L root -d "$rootfs" "$work/disk.raw" 4G >&2
qemu-img convert -f raw -O qcow2 "$work/disk.raw" "$work/disk.qcow2"
rm -f "$work/disk.raw"
echo "$CMDLINE" >"$work/cmdline"
chmod 0644 "$work"/disk.qcow2 "$work"/vmlinuz "$work"/initrd.img "$work"/cmdline "$work"/packages.txt

find "$cache" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name 'build.*' -exec rm -rf {} +
mkdir -p "$out"
mv "$work"/disk.qcow2 "$work"/vmlinuz "$work"/initrd.img "$work"/cmdline "$work"/packages.txt "$out"/
chmod 0755 "$out"
log "built $out ($(du -sh "$out" | cut -f1), kernel $kver) in $((SECONDS - start))s"
echo "$out"
