"""Plans: pure functions from facts and typed inputs to actions or refusals; no I/O. By concern:
``host/`` (the IOMMU's boot change and its trial, the kernel command line, vfio binding),
``vm/`` (the VM list's fit and placement, libvirt domains, cloud-init seeds, what a VM host needs),
``vgpu/`` (mdev, SR-IOV vGPU, MIG layouts and what survives a reboot), ``guest/`` (the NVIDIA
driver, the container toolkit, apt sources and keyrings inside a GPU guest)."""
