"""Host-side plans: the IOMMU's kernel arguments (``cmdline``), the boot trial that tries them
once (``boot_trial``), and binding devices to vfio-pci now and from boot (``vfio``)."""
