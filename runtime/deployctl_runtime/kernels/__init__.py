"""GPU kernels (Triton). Imported lazily, only on CUDA or in tests (TRITON_INTERPRET=1 runs them on CPU tensors)."""
