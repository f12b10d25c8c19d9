"""The command line: inspect, capture, plan, topology, their JSON schemas and safe output, over
captured and emulated hosts."""
