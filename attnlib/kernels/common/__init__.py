"""Kernel pieces shared by several ops (each file with its own tiling docstring)."""
