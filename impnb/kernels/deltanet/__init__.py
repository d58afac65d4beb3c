"""Gated DeltaNet: the causal conv1d with its rolling state, the decode step and the prompt chunk."""
