"""Rules on a source's tensors that the package written from it must meet, applied up front.

`SourceCheckpoint.open` applies them, so `convert`, `inspect` and `verify --source` refuse the same
sources with the same named errors, before anything is written: a source convert accepts gives a
package its own `verify` accepts.
"""

from __future__ import annotations

from pathlib import Path

from ascendconv.errors import UnrecognizedCheckpointError, UnsupportedTensorError, shown
from ascendconv.io.safetensors import TensorEntry

# Keys of quant_model_description.json besides the tensor names: a tensor of one of these names
# would be overwritten by (or taken for) the field.
DESCRIPTION_FIELDS = ("version", "model_quant_type", "metadata", "group_size", "optional")
MX_SCALE_SUFFIX = ".weight_scale"  # the name the package gives an MX layer's E8M0 scales
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")


def check_source_tensors(root: Path, tensors: dict[str, TensorEntry], linears: dict) -> None:
    """Raise a named error for the first source tensor the package could not carry as the loader
    and `verify` expect. `linears`: module prefix -> Fp8Linear (weight, scale, bias)."""
    if not tensors:
        raise UnrecognizedCheckpointError(f"{root}: the weight files hold no tensors", "the checkpoint is empty or damaged")
    paired = {t.name for linear in linears.values() for t in (linear.weight, linear.scale)}
    for name, entry in tensors.items():
        where = f"{entry.path.name}: tensor {shown(name)}"
        if name in DESCRIPTION_FIELDS:
            raise UnsupportedTensorError(
                f"{where} has the name of a field of quant_model_description.json",
                "the package cannot describe a tensor of that name; rename it in the checkpoint",
            )
        if name.endswith(MX_SCALE_SUFFIX):
            raise UnsupportedTensorError(
                f"{where} ends in {MX_SCALE_SUFFIX!r}, the name the package gives MX scales",
                "a block-FP8 checkpoint keeps its scales in '.weight_scale_inv'; remove or rename the stray tensor",
            )
        if entry.dtype in FP8_DTYPES and name not in paired:
            raise UnsupportedTensorError(
                f"{where} is {entry.dtype} but not a block-FP8 weight or scale",
                "a FLOAT tensor of the package must hold floats the loader can read by value",
            )
    for linear in linears.values():
        bias = linear.bias
        if bias is not None and bias.dtype not in FLOAT_DTYPES:
            raise UnsupportedTensorError(
                f"{bias.path.name}: bias {shown(bias.name)} of an FP8 linear is {bias.dtype}, not a float dtype",
                f"an MX layer's bias is written as F32 from one of {', '.join(FLOAT_DTYPES)}",
            )
