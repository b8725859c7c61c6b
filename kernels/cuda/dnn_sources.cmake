# cuDNN convolutions and cuBLASLt fully connected layers (explicit list).
