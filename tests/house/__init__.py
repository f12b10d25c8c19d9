"""The house itself: layers and write points, generated docs, links and examples, the wheel, the
bytecode cache, the skip policy."""
