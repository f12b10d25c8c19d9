"""What gpuprov reads: the confined reader, sysfs and procfs parsers, guest files, captures' odd and hostile input."""
