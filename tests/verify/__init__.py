"""gpuprov verify's checks: the driver, GPUs, containers, the bench, multi-GPU and health."""
