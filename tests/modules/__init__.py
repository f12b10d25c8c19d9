"""The Ansible modules run for real (AnsiballZ) on a bare target Python: options, results, documentation."""
