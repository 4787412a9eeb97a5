"""The device names a suite or the command line may give (torch-free: the suite schema uses it)."""

DEVICES = ("auto", "cpu", "cuda", "mps")
