"""Layout probes: kernels that record what each lane holds, for the PTX layout tests."""
