"""``python -m dev.lab``: an emulated GPU host to run the playbooks against for real.

    python -m dev.lab up [--fresh] [--loader grub|systemd-boot]
                                       build the disk image (cached) and boot the lab host
    python -m dev.lab ssh [CMD...]     a shell or a command on it (root, key auth)
    python -m dev.lab status           running or not, its SSH port, the image's cache key
    python -m dev.lab down             power it off

The lab host is QEMU's q35 under TCG (no KVM needed) with an emulated Intel
IOMMU (``intel-iommu,intremap=on``), booting Debian 12 from its own disk through
its own bootloader: OVMF -> a standalone GRUB EFI on a FAT ESP -> the root
disk's ``/boot/grub/grub.cfg``, which ``update-grub`` inside the lab host writes
from its ``/etc/default/grub``. That file starts without ``intel_iommu=on``
(Debian 12's kernel leaves the Intel IOMMU off), so the IOMMU comes on only when
the iommu_host role adds it and the lab host reboots, as on a real host. That GRUB
uses the root disk's /boot/grub as $prefix, as grub-install would (its modules and
grubenv there), so ``grub-reboot`` works. ``up --loader systemd-boot`` boots a
second image instead (its own cache key, the same recipe otherwise): systemd-boot
on a writable GPT ESP mounted at /boot/efi, its entries made by Debian's
``bootctl install`` and ``kernel-install`` from /etc/kernel/cmdline. Both have an
i6300esb hardware watchdog (QEMU resets the machine when it expires).

QEMU's ``edu`` device (1234:11e8) stands in for GPUs:

- edu A alone behind a pcie-root-port (its own IOMMU group);
- edu B (function 0) with an ich9-intel-hda companion (function 1) behind another;
- edu C and the e1000 management NIC (default route, SSH) behind one
  pcie-pci-bridge: one IOMMU group, which the vfio role must refuse.

The disk image is made only of Debian packages (debootstrap + apt, the build
machine's own apt sources) and cached under ``${GPUPROV_CACHE:-~/.cache/gpuprov}/lab/``,
keyed by the package versions and this file's image recipe; each boot runs on a
copy-on-write overlay (``run/root.qcow2``), so ``up --fresh`` is a brand-new host
in no time. It holds what a GPU host runs VMs with (libvirt, QEMU, OVMF,
python3-libvirt, mdevctl: role gpu_vms' package list, so its install step
changes nothing) and the kernel's ``mtty`` sample mdev driver, built for the lab
kernel and loaded at boot (it plays the GPU vendor's vGPU host driver). For the
nested guest (TCG inside TCG) of inventories/lab it carries a tiny initramfs
(busybox and an /init that lists the guest's PCI devices on its serial console);
the guest's kernel is the lab's own. Building needs root (debootstrap, chroot);
booting and SSH do not. QEMU's user network is ``restrict=on``: nothing leaves
the emulator but the forwarded SSH port on 127.0.0.1. Never shipped to targets
(uses subprocess).
"""
