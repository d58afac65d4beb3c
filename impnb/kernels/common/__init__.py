"""Shared device code: inline-PTX intrinsics and their simulator twins, quant-block decoders, the weights' kernel layout, build checks."""
