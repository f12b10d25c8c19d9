"""Inputs: the one boundary every raw input passes on its way in, raw -> typed or every problem
named by its field: host_vars and module options (``boundary``), the VM list (``vm_list``), the
host declaration and its JSON Schema (``declaration``), vGPU layouts (``vgpu_request``), kernel
arguments (``kernel_args``), and the values they are made of: PCI addresses, paths, names
(``validate``). Pure; imports only core/ and facts/ (docs/reference/inputs.md)."""
