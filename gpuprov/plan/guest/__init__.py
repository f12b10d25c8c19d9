"""Plans inside a GPU guest: the NVIDIA driver (``driver``), NVIDIA's container toolkit and the
engines' runtimes and CDI (``toolkit``), apt's components and keyrings (``aptsources``,
``keyring``)."""
