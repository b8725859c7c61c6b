# Element-wise, BN, pooling, loss, metrics and RANGE-op kernels (explicit list).
