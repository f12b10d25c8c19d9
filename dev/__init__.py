"""Development tooling, run from the checkout and never shipped (the wheel and the collection
leave it out): ``dev.lab`` the emulated lab host, ``dev/emuhost`` the emulated hosts CI boots,
``dev/bench`` the benchmarks, ``dev/device`` the GPU guests' scripts, ``dev/tools`` the
collection build, the docs generator and the multi-GPU probe."""
