#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module gpu_verify: `gpuprov verify` as a task that fails when a check fails."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_verify
short_description: Check that the GPUs work on a guest (or any GPU machine); fail on a failed check
description:
  - Runs the checks of C(gpuprov verify) on the target and returns them, with the whole report.
  - The checks are the NVIDIA driver (loaded, its version, nouveau in the way, kernel module vs libraries),
    the GPUs it shows (NVML through pynvml when importable, else C(nvidia-smi -q -x)) against the NVIDIA
    GPUs on the PCI bus, each GPU's PCIe link (current vs max), a vGPU's framebuffer vs its profile and its
    license, MIG state, Docker's and containerd's NVIDIA runtime, the CDI spec against the GPUs and the
    driver version, and, with a Docker engine (its API on its socket), a container that asks for every GPU and runs
    C(nvidia-smi -L). With O(bench), pinned host<->device copies and a bf16 matmul (torch or cupy) as
    fractions of the link's and the GPU's peak.
  - The task fails when a check has a status listed in O(fail_on) (by default, a failed check); the
    message names each such check with what it found and the fix.
  - The target needs no gpuprov installed; the logic travels with the module. Optional libraries
    (pynvml, torch, cupy) are used when the target's Python has them.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  container:
    description:
      - Start one short-lived container (removed afterwards) that asks Docker for every GPU (CDI first - the
        nvidia runtime, else native CDI, else C(--gpus all)), when an engine answers on its socket (the Docker
        Engine API; no Python package needed). Nothing is pulled. With O(bench), the same bench inside containers
        from the same image, alternated with the guest's, and their ratio.
    type: bool
    default: true
  image:
    description:
      - The local image that container runs from (default a local C(nvidia/cuda), else a glibc distribution
        image). Only with O(root=/).
    type: str
  bench:
    description:
      - Also measure pinned host<->device bandwidth and a bf16 matmul (needs torch or cupy; uses the GPU
        for a few seconds and about 2 GiB of host and GPU memory). Only with O(root=/).
    type: bool
    default: false
  gpu_source:
    description: How to ask the driver for its GPUs; C(auto) is NVML when pynvml imports, else nvidia-smi.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  fail_on:
    description:
      - Check statuses that fail the task. C([]) never fails on a check (read the result and decide);
        C([fail, warn]) is strict.
    type: list
    elements: str
    choices: [fail, warn, skip]
    default: [fail]
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.root
attributes:
  check_mode:
    support: full
    details: Changes nothing in either mode; in check mode no container is started and no bench is run.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - Against a O(root) other than C(/) the GPUs come from the capture's C(capture/nvidia-smi-q-x).
  - The report follows the schema C(gpuprov.verify/v1), documented in C(docs/reference/verify-json.md).
seealso:
  - name: gpuprov verify
    description: The same checks on the command line.
    link: https://github.com/gpuprov/gpuprov
"""

EXAMPLES = r"""
- name: Check the GPUs, the container runtime and a GPU container; fail on a failed check
  gpuprov.kvm.gpu_verify:

- name: Also measure the copies and a matmul, strict about warnings
  gpuprov.kvm.gpu_verify:
    bench: true
    image: nvidia/cuda:12.4.1-base-ubuntu22.04
    fail_on: [fail, warn]

- name: Read the state only, and decide in the play
  gpuprov.kvm.gpu_verify:
    container: false
    fail_on: []
  register: gpu_state

- name: Stop when the driver is not loaded
  ansible.builtin.assert:
    that: gpu_state.report.driver.loaded
    fail_msg: "{{ (gpu_state.checks | selectattr('id', 'equalto', 'driver') | first).fix }}"
"""

RETURN = r"""
checks:
  description: Every check, in a stable order.
  returned: success and when a check fails the task
  type: list
  elements: dict
  contains:
    id:
      description: The check, e.g. C(driver), C(gpus), C(pcie-link), C(docker-runtime), C(cdi-spec).
      type: str
      returned: always
    status:
      description: ok, warn, fail or skip.
      type: str
      returned: always
    message:
      description: What it found.
      type: str
      returned: always
    fix:
      description: What to do about it (null when ok).
      type: str
      returned: always
    gpu:
      description: The GPU's index for per-GPU checks, else null.
      type: int
      returned: always
  sample:
    - id: driver
      status: ok
      message: NVIDIA driver 580.159.04 (open kernel module) loaded (from /proc/driver/nvidia/version)
      fix: null
      gpu: null
failed_checks:
  description: The checks whose status is in O(fail_on).
  returned: success and when a check fails the task
  type: list
  elements: dict
passed:
  description: True when no check failed (whatever O(fail_on) says).
  returned: success and when a check fails the task
  type: bool
summary:
  description: How many checks are ok, warn, fail and skip.
  returned: success and when a check fails the task
  type: dict
  sample: {"ok": 6, "warn": 0, "fail": 0, "skip": 5, "passed": true}
report:
  description: The whole report (schema gpuprov.verify/v1) - driver, GPUs, containers, bench, checks.
  returned: success and when a check fails the task
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import gpu_verify


def main() -> None:
    module = AnsibleModule(argument_spec=gpu_verify.ARGUMENT_SPEC, supports_check_mode=True)
    result, failure = gpu_verify.verify(module)
    if failure:
        module.fail_json(msg=failure, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
