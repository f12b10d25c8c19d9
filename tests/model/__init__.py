"""The host model: the declaration resolved, the old variables and NVIDIA's layout files read into it."""
