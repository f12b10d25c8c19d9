"""Executing plans: the only layer that writes (files, sysfs, commands, libvirt)."""
