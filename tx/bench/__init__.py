"""`tx bench`: train-step and decoding throughput, MFU, compile time and peak memory of tx
against PyTorch peers, each measurement in its own process (see tx/bench/suite.py)."""
