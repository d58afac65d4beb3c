"""Sampling on the GPU: penalties, top-k / top-p / min-p selection, Philox random numbers, argmax, the decode step's token advance."""
