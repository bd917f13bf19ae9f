"""cbserve bench roofline: the measured peak of each instruction the kernels use, and
what the kernels achieve beside it."""
