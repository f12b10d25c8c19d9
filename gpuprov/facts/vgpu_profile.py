"""NVIDIA vGPU profiles: the framebuffer a profile gives, from its name.

Profile names end in ``-<framebuffer GB><series>``, and MIG-backed ones carry
the compute slices before it: ``GRID A100-4C`` (4 GB, C series),
``NVIDIA H100-1-10C`` (1 slice, 10 GB), ``NVIDIA A100-1-5CME`` (media
extension), ``GRID M60-0B`` (the 0 profiles have 512 MiB). vGPU "GB" are GiB:
an A100-4C guest sees 4096 MiB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PROFILE = re.compile(r"^(?P<board>[A-Za-z0-9]+)-(?:(?P<slices>\d+)-)?(?P<fb>\d+)(?P<series>CME|A|B|C|Q)$")


@dataclass
class VgpuProfile:
    name: str  # the profile as named, e.g. "A100-4C"
    framebuffer_mib: int
    series: str  # A (apps), B (desktop), C (compute), Q (workstation), CME...
    mig_slices: int | None  # MIG-backed profiles: compute slices


def parse_profile(product_name: str | None) -> VgpuProfile | None:
    """The profile in a vGPU's product name (``GRID A100-4C``); ``None`` when it names none."""
    if not product_name:
        return None
    last = product_name.strip().split()[-1]
    m = _PROFILE.match(last)
    if not m:
        return None
    fb = int(m.group("fb"))
    return VgpuProfile(
        name=m.group(0),
        framebuffer_mib=512 if fb == 0 else fb * 1024,
        series=m.group("series"),
        mig_slices=int(m.group("slices")) if m.group("slices") else None,
    )
