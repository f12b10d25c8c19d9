#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module guest_toolkit: NVIDIA's container toolkit, Docker when missing, the runtimes and the CDI spec."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: guest_toolkit
short_description: NVIDIA's container toolkit in a GPU guest - each step only when the guest's state owes it
description:
  - Reads the guest (the distribution, dpkg's status file read as a file or C(rpm -q), C(dockerd), C(containerd)
    and C(podman) in the usual directories, C(/etc/docker/daemon.json), containerd's C(config.toml) and
    drop-ins, C(nvidia-ctk), the CDI specs in C(/etc/cdi) and C(/var/run/cdi), the files it manages, when each
    running engine started) and plans; a converged guest costs the reads and one plan.
  - C(repository) - NVIDIA's repository and its signing key - apt - the key fetched from O(gpg_key_url) on the
    guest (or O(gpg_key_data)), dearmored into the binary keyring O(keyring) for a deb822 source signed by it only,
    pinned with O(gpg_fingerprint) - dnf - a C(.repo) file (metadata signed), the key file from O(gpg_key_data).
  - C(docker) - Docker when C(dockerd) is nowhere and O(install_docker) - the distribution's O(docker_packages)
    (apt) or the offline directory's; refused on the RHEL family without an offline directory.
  - C(toolkit) - the O(packages) not installed, from NVIDIA's repository or the offline directory (O(offline_dir),
    its files copied to O(offline_dest) first - a local apt repository with its own C(Packages) index - or handed
    to dnf).
  - C(runtime) - C(nvidia-ctk runtime configure) for Docker and containerd when gpuprov verify's C(docker-runtime)
    or C(containerd-runtime) check is not ok, C(systemctl restart) of a running engine whose configuration is newer
    than its process (O(restart)), and C(nvidia-ctk cdi generate) when the C(cdi-spec) check is not ok (no spec,
    a GPU missing, another driver's libraries). After packages are installed the runtime part is planned again on
    the new state; after nvidia-ctk ran the checks are read again and the module fails when one is still owed.
  - Refusals come before anything changes and name the fix - an option that is not a plain value (a newline, a
    package name starting with C(-)), an offline directory without the toolkit or Docker or a dependency the guest
    lacks (all of them named together),
    Docker from nowhere, a key that does not fetch or has another fingerprint, C(nvidia-ctk) missing, a CDI spec
    owed while the driver is not loaded.
  - One run at a time, with M(gpuprov.kvm.guest_driver) (both run the package manager). The module holds
    C(/run/gpuprov/packages.lock) while it reads and changes the guest, waiting up to 300 s for another run (one
    whose play was killed goes on on the guest); past that it fails, naming the holder, with nothing changed.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  parts:
    description: What to plan (the role's entry points use some), in this order whatever the order given.
    type: list
    elements: str
    choices: [repository, docker, toolkit, runtime]
    default: [repository, docker, toolkit, runtime]
  packages:
    description:
      - The toolkit's packages (their dependencies come along). Empty - C(nvidia-container-toolkit-base), which holds
        all that CDI mode needs (C(nvidia-ctk), C(nvidia-cdi-hook), C(nvidia-container-runtime)), and with
        O(legacy_hook) C(nvidia-container-toolkit) too.
    type: list
    elements: str
    default: []
  legacy_hook:
    description: Install the legacy hook (C(nvidia-container-toolkit) and C(libnvidia-container*)) and leave the nvidia
      runtime's mode alone; without it the runtime is set to CDI mode.
    type: bool
    default: false
  repo_url:
    description: NVIDIA's container toolkit repository (or a mirror of it).
    type: str
    default: https://nvidia.github.io/libnvidia-container/stable
  gpg_key_url:
    description: The repository's signing key, fetched by the guest when O(gpg_key_data) is empty (apt).
    type: str
    default: https://nvidia.github.io/libnvidia-container/gpgkey
  gpg_key_data:
    description: The signing key base64-encoded (armored or binary; armored on the RHEL family), e.g. from C(slurp)
      of a file on the controller, instead of O(gpg_key_url).
    type: str
    default: ""
  gpg_fingerprint:
    description: The primary key's expected fingerprint (hex, spaces allowed); a key with another one is refused.
    type: str
    default: ""
  keyring:
    description: The binary keyring apt's signed-by points at.
    type: path
    default: /etc/apt/keyrings/nvidia-container-toolkit.gpg
  rpm_key:
    description: Where a key given as O(gpg_key_data) goes on the RHEL family.
    type: path
    default: /etc/pki/rpm-gpg/nvidia-container-toolkit.asc
  offline_dir:
    description: The offline directory on the controller (its path names it in messages); set, Docker and the toolkit
      come from it (leave C(repository) out of O(parts) then).
    type: str
    default: ""
  offline_files:
    description: The package files in O(offline_dir) (names), already copied to O(offline_dest).
    type: list
    elements: str
    default: []
  offline_index:
    description:
      - The offline directory's apt C(Packages) index, read on the controller (the lookup C(gpuprov.kvm.offline_index)).
        Every package and dependency the guest lacks (its dpkg status) and the index does not hold is refused before
        anything is written; the index is written beside the copied files for apt.
    type: str
    default: ""
  offline_problems:
    description: What the lookup found wrong in the offline directory (a link, a FIFO, a name that is not a package
      file's); each is a refusal.
    type: list
    elements: str
    default: []
  offline_dest:
    description: Where the offline packages are on the guest (a local apt repository).
    type: path
    default: /var/lib/gpuprov/offline-packages
  install_docker:
    description: Install Docker when the guest has none (C(dockerd) not found).
    type: bool
    default: true
  docker_packages:
    description: Docker's packages (the distribution's C(docker.io), or those in the offline directory).
    type: list
    elements: str
    default: [docker.io]
  runtimes:
    description: Runtimes to configure with C(nvidia-ctk runtime configure). Empty - the engines the guest runs or is
      given (Docker when it is here or installed now, containerd when a containerd service of its own runs).
    type: list
    elements: str
    choices: [docker, containerd]
    default: []
  start:
    description: Start Docker when it is installed and does not run - through systemd, or, on a guest without it (a
      microVM whose PID 1 is not systemd), with C(start-stop-daemon) (its log in C(/var/log/gpuprov-dockerd.log)).
    type: bool
    default: true
  restart:
    description: Restart a running engine whose configuration is newer than its process (a restart stops its
      containers unless live-restore is on).
    type: bool
    default: true
  cdi:
    description: Generate the CDI spec, again whenever gpuprov verify's cdi-spec check is not ok.
    type: bool
    default: true
  cdi_output:
    description: The CDI spec's path.
    type: path
    default: /etc/cdi/nvidia.yaml
  cdi_gpus:
    description:
      - On a GPU host, the GPUs (full PCI addresses) its containers may have - those declared C(use=host). The CDI
        spec then holds only them, never a GPU declared for passthrough or vGPU - C(nvidia-ctk cdi generate) writes
        every GPU the driver shows to C(/var/lib/gpuprov/cdi/nvidia-all.json), and the module writes O(cdi_output)
        with only these (and C(all) standing for them). Unset - every GPU the driver shows (a guest).
    type: list
    elements: str
  architecture:
    description: The package architecture (C(amd64), C(arm64)); empty for the machine's.
    type: str
    default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.plan
  - gpuprov.kvm.root
attributes:
  platform:
    platforms: posix
seealso:
  - module: gpuprov.kvm.gpu_verify
  - module: gpuprov.kvm.guest_driver
"""

EXAMPLES = r"""
- name: The toolkit from NVIDIA's repository, Docker when missing, the runtimes and the CDI spec
  gpuprov.kvm.guest_toolkit:

- name: Only the runtimes and the CDI spec (the toolkit is in the image)
  gpuprov.kvm.guest_toolkit:
    parts: [runtime]

- name: What it would do, pinning NVIDIA's key
  gpuprov.kvm.guest_toolkit:
    gpg_fingerprint: "C95B 321B 61E8 8C18 09C4  F759 DDCA E044 F796 ECB0"
  check_mode: true
"""

RETURN = r"""
plan:
  description: Every action, as text, in order (also in check mode).
  returned: always
  type: list
  elements: str
  sample:
    - run nvidia-ctk runtime configure --runtime=docker (Docker is here but has no NVIDIA runtime ...)
not_run:
  description: Live actions (commands) not run because O(root) is not C(/).
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
      description: Always null here.
      type: str
      returned: always
installs:
  description: The packages the plan installs.
  returned: always
  type: list
  elements: str
configure:
  description: The runtimes C(nvidia-ctk runtime configure) configures.
  returned: always
  type: list
  elements: str
restart:
  description: The engines restarted (their configuration newer than their process).
  returned: always
  type: list
  elements: str
restart_pending:
  description: Engines whose configuration waits for a restart that O(restart=false) does not do.
  returned: always
  type: list
  elements: str
cdi:
  description: Why the CDI spec is generated (gpuprov verify's cdi-spec message); null when it is not.
  returned: always
  type: str
checks:
  description: gpuprov verify's docker-runtime, containerd-runtime and cdi-spec checks the plan came from.
  returned: always
  type: list
  elements: dict
  sample:
    - id: docker-runtime
      status: ok
      message: /etc/docker/daemon.json has the nvidia runtime (/usr/bin/nvidia-container-runtime)
engines:
  description: The container engines found, whether each runs, whether its configuration is newer than it.
  returned: always
  type: dict
  sample:
    docker: {binary: /usr/bin/dockerd, running: true, config_newer: false}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import guest_toolkit
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import (
    one_run_at_a_time,
    refuse_bad_root,
    url_fetcher,
)


def main() -> None:
    module = AnsibleModule(argument_spec=guest_toolkit.ARGUMENT_SPEC, supports_check_mode=True)
    refuse_bad_root(module)
    one_run_at_a_time(module, "packages")
    guest = guest_toolkit.options(module, url_fetcher(module, fetch_url))
    facts, plan = guest.plan()
    guest_toolkit.finish(module, guest, facts, plan)


if __name__ == "__main__":
    main()
