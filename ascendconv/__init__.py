"""ascendconv: FP8, MX and BF16 checkpoints -> AscendV1 MXFP8 / MXFP4 packages for vllm-ascend, offline, on a CPU."""

# The one place the version is written: pyproject.toml reads it from here (a literal, not
# importlib.metadata, whose import alone costs 40 ms of every command's start-up).
__version__ = "0.1.0"
