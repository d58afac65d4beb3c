"""Tensor parallelism over NCCL: ranks, the ctypes binding, the rendezvous, each rank's slices
of the model, and serving's step mirror (docs/DESIGN.md, "Tensor parallelism")."""
