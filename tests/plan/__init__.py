"""The planners: the IOMMU's boot change and trial, kernel arguments, vfio, vGPU, VMs and their
domains, the guest's driver and toolkit."""
