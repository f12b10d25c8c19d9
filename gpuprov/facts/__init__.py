"""Facts: what a host or guest is, read through one ``Sysfs(root)`` (docs/development/layout.md)."""
