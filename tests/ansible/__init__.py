"""The Ansible side as users run it: the collection, roles and playbooks, a real libvirtd, the GPU
guests' recorded runs."""
