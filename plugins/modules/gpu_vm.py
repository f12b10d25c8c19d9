#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module gpu_vm: one libvirt VM with its GPUs, vGPUs, disk and cloud-init seed."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_vm
short_description: A libvirt VM with passed-through GPUs or vGPUs, placed on the GPU's NUMA node
description:
  - Makes one libvirt domain be C(defined), C(running), C(shutdown) or C(absent), from an entry of the
    host's VM list (the role gpu_vms passes C(gpu_vms_list) entries, with C(gpu_vms_defaults) under them).
  - Before anything changes, the whole host list is checked against the host's facts, exactly as
    C(gpuprov plan) does (a device given twice, not vfio-ready, mdev types and C(available_instances),
    mixed vGPU types, host memory/CPUs/hugepages oversubscribed), and the VM's devices against every
    other libvirt domain; any problem refuses the task, changing nothing.
  - The domain is q35 with a pcie-root-port per passed-through device, every function of a GPU on one
    multifunction guest slot, C(managed=yes), vCPUs pinned to host CPUs of the GPU's NUMA node and memory
    bound to it, hugepages when enough are reserved, mdev vGPUs by UUID and SR-IOV vGPU VFs as PCI hostdevs.
  - Its disk is a qcow2 overlay on a base image, its cloud-init NoCloud seed an ISO (user, SSH keys, host name),
    both under O(storage_dir). A missing mdev is created, and an SR-IOV VF gets its vGPU type, through sysfs.
  - Idempotent. The domain is redefined only when the generated XML differs in meaning from the domain's
    persistent definition (what libvirt adds, such as addresses of its own controllers, and whitespace do not
    count). A running domain whose definition changed reports RV(needs_restart).
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
requirements:
  - libvirt Python bindings on the target's interpreter (Debian/Ubuntu C(python3-libvirt), EL
    C(python3-libvirt), or C(libvirt-python) from PyPI); the module fails with that message without them.
  - C(qemu-img), and C(genisoimage), C(xorriso) or C(cloud-localds) for the seed ISO.
options:
  vm:
    description:
      - The VM, as one entry of the host's VM list (C(gpu_vms_list)); the same entries C(gpuprov plan) checks.
      - Checked by gpuprov's VM-list validator, not by Ansible's argument spec, so that the module and
        C(gpuprov plan) read an entry alike; a malformed entry or an unknown key is a refusal naming it.
    type: dict
    required: true
    suboptions:
      name:
        description: The libvirt domain's name; letters, digits and C(_.+-), at most 63.
        type: str
        required: true
      state:
        description: What the domain should be; overrides O(state).
        type: str
        choices: [running, shutdown, defined, absent]
      memory_mib:
        description: Guest memory in MiB (at least 64). All of it is pinned while a device is passed through.
        type: int
        default: 1024
      vcpus:
        description: Virtual CPUs.
        type: int
        default: 1
      firmware:
        description: C(efi) (OVMF, Secure Boot off) or C(bios).
        type: str
        choices: [efi, bios]
        default: efi
      accel:
        description: C(kvm), or C(tcg) on hosts without KVM.
        type: str
        choices: [kvm, tcg]
        default: kvm
      machine:
        description: A q35 machine type (C(q35), C(pc-q35-8.2)...).
        type: str
        default: q35
      gpus:
        description:
          - GPUs passed through whole, by full PCI address (their audio/USB functions come along), or
            mappings with C(address) and C(rom) (C(on), C(off) or an absolute path to a ROM file).
        type: list
        elements: raw
      vfs:
        description:
          - SR-IOV VFs (NVIDIA SR-IOV vGPU), by full PCI address, or mappings with C(address) and C(vgpu_type)
            (the vGPU type ID written to the VF's C(nvidia/current_vgpu_type)).
        type: list
        elements: raw
      mdevs:
        description:
          - mdev vGPUs, mappings with C(parent) (PCI address or parent name), C(type) (e.g. C(nvidia-474)) and
            C(uuid) (derived from the VM's name when absent, the same on every run).
        type: list
        elements: dict
      numa_node:
        description: The NUMA node for vCPUs and memory; default the node of the first GPU, VF or mdev parent.
        type: int
      cpuset:
        description: Host CPUs, one per vCPU (C(8-15) or a list), instead of the automatic placement.
        type: raw
      pin:
        description: Pin each vCPU to a host CPU of the node.
        type: bool
        default: true
      hugepages:
        description: Back memory with hugepages; C(auto) when enough are reserved on the node, C(yes) requires them.
        type: str
        choices: [auto, "yes", "no"]
        default: auto
      hide_kvm:
        description: Hide the hypervisor from the guest; default on for consumer NVIDIA GPUs (GeForce, TITAN).
        type: bool
      vendor_id:
        description: The Hyper-V vendor_id shown to the guest, 1 to 12 letters or digits.
        type: str
      network:
        description: The libvirt network of the VM's virtio NIC; empty for no NIC.
        type: str
        default: default
      mac:
        description: The NIC's MAC address; default derived from the name, the same on every run.
        type: str
      disk:
        description: The VM's disk, a qcow2 overlay on a base image.
        type: dict
        suboptions:
          base:
            description: The base image (absolute path) the overlay is backed by.
            type: path
          size_gib:
            description: The overlay's virtual size in GiB; default the base's.
            type: int
          path:
            description: The overlay (absolute path); default C(STORAGE_DIR/NAME.qcow2).
            type: path
      cloud_init:
        description: A cloud-init NoCloud seed ISO for the guest.
        type: dict
        suboptions:
          user:
            description: The user cloud-init creates.
            type: str
            default: gpuadmin
          ssh_authorized_keys:
            description: Public keys for that user.
            type: list
            elements: str
          hostname:
            description: The guest's host name; default the VM's name.
            type: str
          packages:
            description: Packages cloud-init installs.
            type: list
            elements: str
      boot:
        description: Direct kernel boot from files on the host.
        type: dict
        suboptions:
          kernel:
            description: The kernel (absolute path).
            type: path
            required: true
          initrd:
            description: The initrd (absolute path).
            type: path
          cmdline:
            description: The kernel command line.
            type: str
      autostart:
        description: Start the domain when libvirt starts.
        type: bool
        default: false
      drain:
        description:
          - What M(gpuprov.kvm.gpu_host_drain) does to the running VM when its host must reboot or rebind
            a device it holds; gpu_vm itself does not read it.
          - C(shutdown) shuts it down (ACPI) and waits, and the drain fails if it does not stop; C(force)
            then powers it off; C(keep) leaves it alone, and the drain refuses the host, naming the VM.
            See docs/guides/rolling.md.
        type: str
        choices: [shutdown, force, keep]
        default: shutdown
      nvlink_clique:
        description:
          - The VM's GPUs joined by NVLink, so the guest driver allows P2P among them (QEMU's
            C(x-nv-gpudirect-clique)); C(true) for all its GPUs as one clique, or a list of cliques,
            each a list of its GPU addresses. See docs/reference/vm-domain.md.
        type: raw
  state:
    description:
      - What the domain should be. The VM entry's own C(state) key wins over this.
      - C(defined) defines (or redefines) it and leaves it as it is; C(running) also starts it;
        C(shutdown) shuts it down (ACPI, then power off after O(shutdown_timeout)); C(absent) powers it off
        and undefines it.
    type: str
    choices: [defined, running, shutdown, absent]
    default: running
  defaults:
    description:
      - Keys of O(vm) every VM of the list gets unless it sets them (the role passes C(gpu_vms_defaults));
        mappings such as C(cloud_init) merge key by key. Applied to O(vm) and to each of O(host_vms).
    type: dict
    default: {}
  host_vms:
    description:
      - The host's whole VM list, entries like O(vm). CPU pinning places this VM after the ones before it in
        that list and the whole list is checked, so VMs never share pinned CPUs or devices. Empty means this VM alone.
    type: list
    elements: dict
    default: []
  uri:
    description: libvirt connection URI.
    type: str
    default: qemu:///system
  storage_dir:
    description: Where overlays and seeds are made (readable by the QEMU user).
    type: path
    default: /var/lib/libvirt/images/gpuprov
  remove_storage:
    description: With O(state=absent), also delete the overlay and seed that gpuprov made (never a given C(disk.path)).
    type: bool
    default: false
  reserved_memory_mib:
    description: Host memory kept for the host; unset means 10% of it, at most 4 GiB.
    type: int
  reserved_cpus:
    description: Host CPUs (cpulist, C(0-1,8)) kept for the host; pinned vCPUs never use them.
    type: str
    default: "0"
  mixed_vgpu_types:
    description: The GPUs run NVIDIA's mixed-size vGPU mode, so one GPU may hold vGPUs of several types.
    type: bool
    default: false
  declared:
    description:
      - The host's declared GPUs, address -> C({use, entry}), as the module gpu_host_model returns them
        (C(ansible_facts.gpuprov_model.declared); role gpu_vms passes it). The VM is refused when it is
        given a whole GPU not declared C(use=passthrough), an mdev whose parent is not C(use=mdev), or a VF
        whose GPU is not C(use=sriov_vgpu), or a device not declared at all. Unset, nothing is checked
        against a declaration.
    type: dict
  wait_for_address:
    description:
      - With O(state=running), wait up to this many seconds for the guest's DHCP lease on its libvirt
        network and return it in RV(addresses); 0 does not wait.
      - Only a lease taken since the domain's current boot counts (a guest that shut down cleanly released
        its own, while the MAC's older leases may still be held), whoever started the domain.
    type: int
    default: 0
  shutdown_timeout:
    description: Seconds an ACPI shutdown may take before the domain is powered off.
    type: int
    default: 180
  install:
    description:
      - First install what the VMs need where it is missing, and run libvirt (the plan of M(gpuprov.kvm.gpu_vm_host),
        read and carried out in this module run; the OS family from C(/etc/os-release), the packages installed
        from dpkg's status file or C(rpm --query), the libvirt units' state from one C(systemctl show)); a converged
        host plans nothing. Role gpu_vms sets it from C(gpu_vms_install).
      - In check mode, when libvirt is not installed or running yet, the VM's plan takes the domain as absent (a
        warning says so).
    type: bool
    default: false
  packages:
    description: With O(install), the packages to install instead of the OS family's list (empty - that list).
    type: list
    elements: str
    default: []
  console_checks:
    description:
      - Checks of the running domain's serial log (C(paths.serial_log)), read on the host after the domain is
        at its state, in this module run; for guests with no network, or to check them from inside before SSH.
        Read only; skipped in check mode and unless the state is C(running).
      - Each waits until O(console_checks[].wait_for) matches the log, then matches every
        O(console_checks[].expect) against it; a timeout or a pattern that does not match fails the task with the
        end of the log. An absent or unreadable log matches nothing.
      - Role gpu_vms passes C(gpu_vms_console_checks) whole, with C(gpu_vms_check_consoles).
    type: list
    elements: dict
    default: []
    suboptions:
      vm:
        description:
          - The VM the check is for; omitted, this one. An entry naming another VM of O(host_vms) is skipped here
            (that VM's own run checks it); one naming no VM of the list is refused.
        type: str
      wait_for:
        description: A Python regular expression to wait for in the log (searched in its first 16 MiB).
        type: str
        required: true
      timeout:
        description: Seconds to wait for it, 1 to 86400.
        type: int
        default: 600
      expect:
        description: Python regular expressions that must each match the log once it holds O(console_checks[].wait_for).
        type: list
        elements: str
        default: []
  root:
    description:
      - The host's root for its facts (C(/) on a real host; a captured or staged root for dry runs).
      - With another root the module plans and reports; the seed files are written below that root, and
        commands (C(qemu-img), the ISO tool, C(mkdir)), sysfs writes and libvirt (unless O(uri) is libvirt's
        test driver, C(test:///...), which holds no machine) are not touched on this machine; they are
        listed in RV(not_run).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.plan
  - gpuprov.kvm.root
attributes:
  diff_mode:
    details: Shows the domain XML diff and the seed files.
  platform:
    platforms: posix
notes:
  - Check mode reports the plan and, with C(--diff), the domain XML diff and seed files; it changes nothing.
  - Every option, and every key inside O(vm), O(defaults) and O(host_vms), is checked before anything is read
    from libvirt or changed (real booleans and numbers, bounded ranges and CPU lists, names by libvirt's rules,
    one SSH key per entry, a unicast MAC, ROM files in /var/lib/libvirt/roms); every problem is reported at once
    in RV(refusals). See docs/reference/inputs.md.
seealso:
  - module: gpuprov.kvm.vfio_bind
"""

EXAMPLES = r"""
- name: A training VM with a whole GPU (and its audio function), pinned to the GPU's NUMA node
  gpuprov.kvm.gpu_vm:
    vm:
      name: train-01
      memory_mib: 131072
      vcpus: 16
      gpus: ["0000:41:00.0"]
      disk: {base: /var/lib/libvirt/images/debian-12-genericcloud-amd64.qcow2, size_gib: 200}
      cloud_init: {user: gpuadmin, ssh_authorized_keys: ["ssh-ed25519 AAAA... admin"]}
    wait_for_address: 600

- name: Two VMs sharing a GPU through mdev vGPUs of one type
  gpuprov.kvm.gpu_vm:
    vm: "{{ item }}"
    host_vms: "{{ gpu_vms_list }}"
  loop: "{{ gpu_vms_list }}"

- name: Remove a VM and its overlay
  gpuprov.kvm.gpu_vm:
    vm: {name: train-01}
    state: absent
    remove_storage: true
"""

RETURN = r"""
plan:
  description: Every action, as text, in order (also in check mode).
  returned: always
  type: list
  elements: str
  sample:
    - run qemu-img create -q -f qcow2 -F qcow2 -b /srv/base.qcow2 /srv/vms/vm1.qcow2 (disk of vm1)
    - define domain vm1 (new)
    - start domain vm1 (state running)
xml:
  description: The domain XML gpuprov generates for the VM (normalized), when it is not absent.
  returned: success
  type: str
placement:
  description: NUMA node, host CPU per vCPU, hugepage size and guest slots (each GPU's functions).
  returned: success
  type: dict
  sample: {"numa_node": 1, "cpus": [16, 17], "hugepage_kib": 1048576, "pci_slots": [["0000:41:00.0", "0000:41:00.1"]]}
paths:
  description: The overlay, base image, seed folder and ISO, and serial log of the VM.
  returned: success
  type: dict
mac:
  description: The MAC address of the VM's NIC (given, or derived from its name).
  returned: success
  type: str
addresses:
  description: IPv4 addresses leased to the VM (with O(wait_for_address)).
  returned: success
  type: list
  elements: str
guest:
  description: The running guest, once it has an address (with O(wait_for_address)), for C(add_host).
  returned: when the guest got an address
  type: dict
  sample: {"name": "train-01", "address": "192.168.122.57", "addresses": ["192.168.122.57"], "user": "gpuadmin"}
host:
  description: With O(install), what the host needs (M(gpuprov.kvm.gpu_vm_host)'s result keys); null without.
  returned: success
  type: dict
  sample: {"os_family": "debian", "packages": ["libvirt-daemon-system"], "missing": [], "services": []}
console:
  description: The serial log checked with O(console_checks), the last 20 lines of it, and the problems found.
  returned: when O(console_checks) ran
  type: dict
  sample: {"log": "/var/log/libvirt/qemu/lab-nested-serial.log", "tail": ["GPUPROV-NESTED-END"], "problems": []}
guest_user:
  description: The user cloud-init creates in the guest (C(cloud_init.user)), for SSH; null without a seed.
  returned: success
  type: str
  sample: gpuadmin
state:
  description: The state the VM was brought to (the VM entry's own, else O(state)).
  returned: success
  type: str
needs_restart:
  description: The definition of a running domain changed; it applies from the next start.
  returned: success
  type: bool
not_run:
  description: Live actions (sysfs writes, commands) not run because O(root) is not C(/).
  returned: always
  type: list
  elements: str
refusals:
  description: Why the module refused, one entry per problem; nothing was changed.
  returned: failed
  type: list
  elements: dict
  contains:
    message:
      description: The problem.
      type: str
      returned: always
    fix:
      description: How to fix it (null when the message says it).
      type: str
      returned: always
    device:
      description: The PCI address the problem concerns (null for none).
      type: str
      returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import gpu_vm
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import refuse_bad_root
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.gpu_vm import finish_vm


def main() -> None:
    module = AnsibleModule(argument_spec=gpu_vm.ARGUMENT_SPEC, supports_check_mode=True)
    refuse_bad_root(module)
    given, facts = gpu_vm.checked_options(module)
    plan, conn, extra = gpu_vm.plan(module, given, facts)
    finish_vm(module, plan, conn, module.params["root"], **extra)


if __name__ == "__main__":
    main()
