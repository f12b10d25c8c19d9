"""Verify: a guest or host read again and checked against what it should be."""
