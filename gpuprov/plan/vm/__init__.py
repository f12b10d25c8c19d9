"""VM plans: a host's VM list fitted and placed (``fit``, ``checks``, ``place``), one VM's plan
(``plan``), its libvirt domain (``domain``, ``domain_compare``), its cloud-init seed (``seed``),
and what a host needs installed to run VMs (``host``)."""
