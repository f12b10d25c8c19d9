"""pci.ids lookups (gpuprov/facts/names.py): vendor and device names, never a subsystem's or
another vendor's line, and nothing past the vendor list."""

from __future__ import annotations

from gpuprov.facts.names import PciIds

PCI_IDS = """# pci.ids excerpt
#	version and comments
10de  NVIDIA Corporation
	2330  GH100 [H100 SXM5 80GB]
		10de 16c1  H100 SXM5 80GB
	2331  GH100 [H100 PCIe]
# a comment inside the vendor
	26b9  AD102GL [L40S]
1234  Technical Corp.
	11e8  edu
8086  Intel Corporation
	29c0  82G33/G31/P35/P31 Express DRAM Controller
C 03  Display controller
	00  VGA compatible controller
		2330  not a device
"""


def test_names_of_vendors_and_devices() -> None:
    ids = PciIds(PCI_IDS)
    assert ids.lookup(0x10DE, 0x2330) == ("NVIDIA Corporation", "GH100 [H100 SXM5 80GB]")
    assert ids.lookup(0x10DE, 0x26B9) == ("NVIDIA Corporation", "AD102GL [L40S]")  # after a comment
    assert ids.lookup(0x1234, 0x11E8) == ("Technical Corp.", "edu")
    assert ids.lookup(0x8086, 0x29C0) == ("Intel Corporation", "82G33/G31/P35/P31 Express DRAM Controller")


def test_no_name_from_a_subsystem_another_vendor_or_the_class_list() -> None:
    ids = PciIds(PCI_IDS)
    assert ids.lookup(0x10DE, 0x16C1) == ("NVIDIA Corporation", None)  # a subsystem line only
    assert ids.lookup(0x1234, 0x2330) == ("Technical Corp.", None)  # NVIDIA's device, not Technical's
    assert ids.lookup(0x8086, 0x2330) == ("Intel Corporation", None)  # the class list's line
    assert ids.lookup(0xFFFF, 0x0001) == (None, None)
    assert ids.lookup(None, 0x2330) == (None, None)
    assert ids.lookup(0x10DE, None) == ("NVIDIA Corporation", None)
