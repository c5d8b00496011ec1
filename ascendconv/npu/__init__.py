"""Optional Ascend path: the only package that imports torch / torch_npu / vllm_ascend, and only
lazily, inside functions. Importing ``ascendconv.npu`` never imports torch.

The GroupedMatmulSituQuant operator lives here whole: its validated input type and CPU reference
(`reference.py`, numpy) and its device runner (`device.py`, torch on an Ascend 950)."""

from .device import NpuUnavailable, npu_available, run_gmm_situ_on_npu
from .reference import GmmSituInputs

__all__ = ["GmmSituInputs", "NpuUnavailable", "npu_available", "run_gmm_situ_on_npu"]
