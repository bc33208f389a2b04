"""PyTorch's own modules with our weights copied in: the oracle the parity tests, the lessons and
``bench/parity.py`` measure the core against (``pytorch_oracle.py``). It imports only the core."""
