"""What ``gpuprov verify`` reads inside a guest (or on any GPU machine): the
NVIDIA driver, the GPUs it shows (NVML or nvidia-smi), vGPU profiles, the
container runtime's configuration, a container run and the optional bench.

Files are read through :class:`gpuprov.host.sysfs.Sysfs`, so ``--root`` works on
a capture as on the live machine. Optional libraries (pynvml, docker, torch,
cupy) are imported only when used and are passed in as module objects, so the
tests fake them at that boundary.
"""
