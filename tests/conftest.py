"""Shared test set-up.

Triton reads TRITON_INTERPRET when it is first imported, so it is set here,
before any test module imports commrt.kernels: the same @triton.jit kernels
then run on CPU tensors.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
