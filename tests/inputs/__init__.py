"""The input boundary: host_vars, module options, the VM list, console checks, intent; hostile and random input."""
