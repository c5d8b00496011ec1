"""Optional Ascend path: the only package that imports torch / torch_npu / vllm_ascend, and only
lazily, inside functions. Importing ``ascendconv.npu`` never imports torch."""

from .gmm_situ import NpuUnavailable, npu_available, run_gmm_situ_on_npu

__all__ = ["NpuUnavailable", "npu_available", "run_gmm_situ_on_npu"]
