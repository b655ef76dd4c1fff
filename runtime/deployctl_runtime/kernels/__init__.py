"""Kernels: Triton for CUDA (paged_attention.py, imported lazily, only on CUDA or in tests, where TRITON_INTERPRET=1
runs them on CPU tensors) and C for the CPU float32 path (cpu_ops.c, built and loaded by cpu_kernels.py)."""
