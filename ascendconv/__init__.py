"""ascendconv: Hugging Face block-FP8 checkpoints -> AscendV1 MXFP8 / MXFP4 packages, offline, on a CPU."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ascendconv")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
