"""GPU tests: each kernel against its numpy reference, each model against the reference."""
