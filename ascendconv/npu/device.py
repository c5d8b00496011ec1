"""Run GroupedMatmulSituQuant on an Ascend 950 NPU (contract section 5), for ``verify --on-npu``.

This module is the only place in the project that touches ``torch`` / ``torch_npu`` /
``vllm_ascend``, and it imports them lazily, inside functions: importing it costs nothing on a
machine without them. Layout conversions (scale pairing) come from
:mod:`ascendconv.npu.reference`; nothing here re-implements numerics.

Facts marked *(assumed)* in the contract (docs/contract.md) are named constants below, so that a correction is one change.
"""

from __future__ import annotations

import numpy as np

from ascendconv.npu import reference as ref
from ascendconv.npu.reference import GmmSituInputs

__all__ = [
    "NpuUnavailable",
    "npu_available",
    "run_gmm_situ_on_npu",
    "A5_DEVICE_NAME_MARKER",
    "A5_SOC_VERSION",
    "WRAPPER_MODULE",
]

#: ``torch.npu.get_device_name()`` of an Ascend 950 contains this (vllm-ascend's own op test).
A5_DEVICE_NAME_MARKER = "Ascend950"
#: ``torch_npu.npu.get_soc_version()`` of the A5 / Ascend 950 family (vllm-ascend utils) *(assumed)*.
A5_SOC_VERSION = 260
#: vllm-ascend's Python wrapper of the fused op (version 0.1.0 of that module) *(assumed stable)*.
WRAPPER_MODULE = "vllm_ascend.ops.grouped_matmul_situ_quant"
#: ``torch_npu.npu_format_cast`` format id of FRACTAL_NZ (what ``to_weight_nz`` casts to).
ACL_FORMAT_FRACTAL_NZ = 29
#: The only mode combination the fused op implements (MX A8W4).
DEQUANT_MODE_MX_JOINT = 1
DEQUANT_DTYPE_BF16 = 0
QUANT_MODE_DYNAMIC_MX = 1
#: group_list holds per-expert counts.
GROUP_LIST_TYPE_COUNTS = 1


class NpuUnavailable(RuntimeError):
    """The Ascend path cannot run here; ``str(exc)`` (and ``exc.reason``) says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# Tensors are reinterpreted with ``Tensor.view(dtype)``, which needs real ``torch.dtype``s: these come
# from torch (float8_e8m0fnu since 2.7, float4_e2m1fn_x2 since 2.8). torch_npu's attributes of the
# same names are op-argument codes (``input_dtype=``, ``per_token_scale_dtype=``), not view dtypes.
_VIEW_DTYPES = ("float8_e4m3fn", "float8_e8m0fnu", "float4_e2m1fn_x2")


def _probe():
    """Return ``(ok, reason, ctx)``; ``ctx`` holds the imported modules when ``ok``."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install
        return False, f"torch is not installed or failed to import ({exc.__class__.__name__}: {exc})", None
    try:
        import torch_npu
    except Exception as exc:
        return False, f"torch_npu is not installed or failed to import ({exc.__class__.__name__}: {exc})", None

    try:
        npu = getattr(torch, "npu", None) or torch_npu.npu
        if not npu.is_available() or npu.device_count() < 1:
            return False, "no NPU device is visible (torch.npu.is_available() is False)", None
    except Exception as exc:
        return False, f"could not query NPU devices ({exc.__class__.__name__}: {exc})", None

    name, soc = "", None
    try:
        name = str(torch_npu.npu.get_device_name(0) or "")
    except Exception:
        name = ""
    try:
        soc = int(torch_npu.npu.get_soc_version())
    except Exception:
        soc = None
    if A5_DEVICE_NAME_MARKER not in name and soc != A5_SOC_VERSION:
        return (
            False,
            f"GroupedMatmulSituQuant needs an Ascend 950 (A5); this device is "
            f"{name or 'unknown'!r} (soc version {soc})",
            None,
        )

    missing = [label for label in _VIEW_DTYPES if getattr(torch, label, None) is None]
    if missing:
        return False, f"this torch lacks the dtypes torch.{', torch.'.join(missing)} (torch >= 2.8 needed)", None

    try:
        import vllm_ascend  # noqa: F401
    except Exception as exc:
        return False, f"vllm_ascend is not installed or failed to import ({exc.__class__.__name__}: {exc})", None

    import importlib

    wrapper = None
    try:
        wrapper = importlib.import_module(WRAPPER_MODULE)
    except ModuleNotFoundError:
        wrapper = None  # older vllm-ascend: fall back to the raw custom op below
    except Exception as exc:
        return False, f"{WRAPPER_MODULE} failed to import ({exc.__class__.__name__}: {exc})", None

    if wrapper is not None:
        try:
            ok = bool(wrapper.is_available())
        except Exception as exc:
            return False, f"{WRAPPER_MODULE}.is_available() raised {exc.__class__.__name__}: {exc}", None
        if not ok:
            return (
                False,
                f"{WRAPPER_MODULE}.is_available() is False (needs the Ascend950 SoC and the op "
                f"built into vllm_ascend_C: reinstall vllm-ascend with SOC_VERSION=ascend950)",
                None,
            )
        return True, f"{WRAPPER_MODULE} on {name or 'NPU'}", {"torch": torch, "torch_npu": torch_npu, "wrapper": wrapper}

    try:
        from vllm_ascend.utils import enable_custom_op

        enable_custom_op()
        has_op = hasattr(torch.ops._C_ascend, "grouped_matmul_situ_quant") and hasattr(
            torch.ops._C_ascend, "grouped_matmul_situ_quant_weight_nz"
        )
    except Exception as exc:
        return False, f"could not load vllm-ascend custom ops ({exc.__class__.__name__}: {exc})", None
    if not has_op:
        return (
            False,
            "torch.ops._C_ascend.grouped_matmul_situ_quant is not registered (vllm-ascend too old, "
            "or not built with SOC_VERSION=ascend950)",
            None,
        )
    return True, f"torch.ops._C_ascend on {name or 'NPU'}", {"torch": torch, "torch_npu": torch_npu, "wrapper": None}


def npu_available() -> tuple[bool, str]:
    """Whether :func:`run_gmm_situ_on_npu` can run here, and why (not).

    Checks, in order: ``torch``, ``torch_npu``, a visible NPU, the Ascend 950 SoC (device name or
    soc version), the FP8/E8M0/FP4 dtypes, ``vllm_ascend``, and the op (the wrapper's
    ``is_available()``, or the raw custom op when the wrapper module does not exist). Never raises.
    """
    try:
        ok, reason, _ = _probe()
    except Exception as exc:  # defensive: a probe must never crash the caller
        return False, f"NPU probe failed ({exc.__class__.__name__}: {exc})"
    return ok, reason


def _to_device(torch, array: np.ndarray, device, dtype):
    # a writable C-contiguous copy: torch.from_numpy warns on read-only (memory-mapped) arrays
    t = torch.from_numpy(np.array(array, order="C", copy=True)).to(device)
    return t if dtype is None else t.view(dtype)


def run_gmm_situ_on_npu(inputs: GmmSituInputs, weight_format: str = "nz") -> tuple[np.ndarray, np.ndarray]:
    """Run the fused GroupedMatmulSituQuant op once; same inputs and results as
    :func:`ascendconv.npu.reference.gmm_situ_quant_reference`.

    Scales arrive in the reference layouts and are paired here into the op's ``(M, K/64, 2)`` /
    ``(E, K/64, N, 2)``. ``weight_format`` is ``"nz"`` (weights cast once with ``to_weight_nz``) or
    ``"nd"``. Rows at or beyond ``sum(group_sizes)`` are undefined on the NPU and are returned as
    zero, like the reference.

    Raises:
        ValueError: an unknown ``weight_format`` (checked before any device work).
        NpuUnavailable: no usable Ascend 950 / torch_npu / vllm-ascend op; the message says why.
    """
    if weight_format not in ("nz", "nd"):
        raise ValueError(f"weight_format must be 'nz' or 'nd', got {weight_format!r}")
    m, n, gs = inputs.m, inputs.n, inputs.group_sizes
    x_codes, x_scales, w_packed, w_scales = inputs.x_codes, inputs.x_scales, inputs.w_packed, inputs.w_scales
    beta, linear_beta = inputs.beta, inputs.linear_beta
    ok, reason, ctx = _probe()
    if not ok:
        raise NpuUnavailable(reason)

    half = n // 2
    y_codes = np.zeros((m, half), dtype=np.uint8)
    y_scales = np.zeros((m, half // ref.GROUP), dtype=np.uint8)
    total = int(gs.sum())
    if m == 0:
        return y_codes, y_scales

    torch, torch_npu, wrapper = ctx["torch"], ctx["torch_npu"], ctx["wrapper"]
    fp4x2 = torch.float4_e2m1fn_x2
    e8m0 = torch.float8_e8m0fnu
    device = torch.device("npu", torch.npu.current_device())

    with torch.inference_mode():
        x = _to_device(torch, x_codes, device, torch.float8_e4m3fn)
        xs = _to_device(torch, ref.pair_activation_scales(x_scales), device, e8m0)
        w = _to_device(torch, w_packed, device, fp4x2)  # (E, N, K/2), one byte per fp4 pair
        ws = _to_device(torch, ref.pair_scales(w_scales), device, e8m0)  # (E, K/64, N, 2)
        group_list = _to_device(torch, gs.astype(np.int64), device, None)

        if wrapper is not None:
            weight = wrapper.to_weight_nz(w) if weight_format == "nz" else w
            y, y_scale = wrapper.grouped_matmul_situ_quant(
                x,
                xs,
                weight,
                ws,
                group_list,
                beta=float(beta),
                linear_beta=float(linear_beta),
                group_list_type=GROUP_LIST_TYPE_COUNTS,
                weight_format=weight_format,
            )
        else:
            if weight_format == "nz":
                # the same cast as vllm-ascend's to_weight_nz
                weight = torch_npu.npu_format_cast(
                    w,
                    ACL_FORMAT_FRACTAL_NZ,
                    customize_dtype=torch.float8_e4m3fn,
                    input_dtype=getattr(torch_npu, "float4_e2m1fn_x2", fp4x2),
                ).transpose(1, 2)
                op = torch.ops._C_ascend.grouped_matmul_situ_quant_weight_nz
            else:
                weight = w
                op = torch.ops._C_ascend.grouped_matmul_situ_quant
            y, y_scale = op(
                x,
                weight,
                ws,
                None,  # weightAssistMatrix (ignored by the kernel)
                None,  # bias (refused)
                xs,
                None,  # smoothScale (refused)
                group_list,
                DEQUANT_MODE_MX_JOINT,
                DEQUANT_DTYPE_BF16,
                QUANT_MODE_DYNAMIC_MX,
                GROUP_LIST_TYPE_COUNTS,
                None,  # tuningConfig (ignored)
                float(beta),
                float(linear_beta),
            )
        torch.npu.synchronize()
        y_np = y.view(torch.uint8).cpu().numpy()
        ys_np = y_scale.view(torch.uint8).cpu().numpy()

    if y_np.shape != (m, half):
        raise RuntimeError(f"GroupedMatmulSituQuant returned y of shape {y_np.shape}, expected {(m, half)}")
    if ys_np.size != m * (half // ref.GROUP):
        raise RuntimeError(
            f"GroupedMatmulSituQuant returned y_scale of shape {ys_np.shape}, expected "
            f"{(m, half // ref.PAIR, 2)}"
        )
    ys_np = ref.unpair_activation_scales(ys_np.reshape(m, half // ref.PAIR, 2))
    y_codes[:total] = y_np[:total]
    y_scales[:total] = ys_np[:total]
    return y_codes, y_scales
