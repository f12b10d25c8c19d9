"""The ``gpuprov`` command line: argument parsing, terminal output, captures (not shipped to hosts)."""
