"""gpuprov: turn KVM/libvirt hosts with NVIDIA GPUs into GPU-sharing hosts.

The host logic (``gpuprov.host``, ``gpuprov.assess``, ``gpuprov.capture``) is
standard-library only: Ansible modules ship it to targets through
``module_utils``, so a target needs no ``pip install gpuprov``.
"""

__version__ = "0.1.0"
