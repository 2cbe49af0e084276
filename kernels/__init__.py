"""Fused pack / unpack / reduce kernels (Triton on CUDA, torch reference on CPU)."""
