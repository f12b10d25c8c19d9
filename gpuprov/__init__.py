"""gpuprov: turn KVM/libvirt hosts with NVIDIA GPUs into GPU-sharing hosts.

Folders follow the flow facts -> rules -> plan -> apply -> verify -> report, with the command
line in ``cli`` (docs/development/layout.md). Everything outside ``cli`` is standard-library
only: Ansible modules ship it to targets through ``module_utils``, so a target needs no
``pip install gpuprov``.
"""

__version__ = "0.1.0"

from .bytecode_cache import install as _cache_bytecode

# Shipped in a zip (an Ansible module's payload, the boot zipapp): compile each module once, not
# on every run (gpuprov/bytecode_cache.py).
_cache_bytecode(__name__, globals().get("__loader__"))
