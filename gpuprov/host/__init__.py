"""Host facts: one model of a host, read through one root-relative reader."""
