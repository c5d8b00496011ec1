"""CPU reference of the GroupedMatmulSituQuant chain (contract section 5). Pure numpy, no I/O.

It lives beside the device runner (`device.py`), which checks the NPU against it; neither imports
the other's dependencies (this module needs no torch).

The golden split chain the fused Ascend 950 operator must equal bit for bit on the NPU:

1. per expert ``e``, over its consecutive token rows:
   ``h = dequant(x_rows) @ dequant(W_e)^T`` accumulated in float32, cast to BF16, shape ``(rows, N)``;
   rows ``[0, I)`` of ``W_e`` are the expert's ``gate_proj``, rows ``[I, 2I)`` its ``up_proj``
   (vLLM's w13 order), ``N = 2I``;
2. SiTU in float32 on ``gate = h[:, :N/2]`` and ``up = h[:, N/2:]``:
   ``g = beta * tanh(gate / beta) * sigmoid(gate)``, ``u = linear_beta * tanh(up / linear_beta)``,
   output ``g * u`` cast to BF16;
3. dynamic MX quantization of each row: ``floor`` rule, E4M3, nearest-even, saturating.

This reference and the NPU differ in float32 summation order and in the NPU's tanh approximation:
compare with a stated tolerance, never bit for bit.

Layouts (all scale bytes are E8M0 ``uint8``):

- package / reference layout: activations ``(M, K/32)``, weights ``(E, N, K/32)`` (one byte per
  MX group of 32 values along K);
- operator layout: activations ``(M, K/64, 2)``, weights ``(E, K/64, N, 2)`` -- groups ``2j`` and
  ``2j+1`` of a row ``n`` become ``[j, n, 0]`` and ``[j, n, 1]`` (the pairing the W4A8_MXFP
  loader produces). See :func:`pair_scales` / :func:`unpair_scales` and
  :func:`pair_activation_scales` / :func:`unpair_activation_scales`; the device runner uses
  these, never its own copies.

Group sizes are per-expert token counts (``group_list_type = 1``). Rows at or beyond
``sum(group_sizes)`` belong to no expert: the NPU leaves them undefined; this reference leaves
them zero (codes 0, scale bytes 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ascendconv.errors import plural
from ascendconv.formats import constants, elements, mx

__all__ = [
    "GROUP",
    "PAIR",
    "GmmSituInputs",
    "dequantize_activations",
    "dequantize_expert_weight",
    "dynamic_mx_quant",
    "grouped_matmul_bf16",
    "situ_bf16",
    "gmm_situ_float",
    "gmm_situ_quant_reference",
    "make_activations",
    "pair_scales",
    "unpair_scales",
    "pair_activation_scales",
    "unpair_activation_scales",
    "stack_w13",
]

#: Values per MX group along K.
GROUP = constants.GROUP_SIZE
#: Alignment of K and of N/2 required by the operator (two MX groups per scale pair).
PAIR = 2 * GROUP


# ---------------------------------------------------------------------------------------------
# validation


def _require_u8(name: str, a: np.ndarray, ndim: int) -> None:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.uint8:
        raise ValueError(f"{name} must have dtype uint8, got {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")


def _check_positive(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def _group_sizes_array(group_sizes, num_experts: int) -> np.ndarray:
    gs = np.asarray(group_sizes)
    if gs.ndim != 1 or gs.shape[0] != num_experts:
        raise ValueError(
            f"group_sizes must be 1-D with one count per expert ({num_experts}), got shape {gs.shape}"
        )
    if gs.size and gs.dtype.kind not in "iu":
        raise ValueError(f"group_sizes must hold integers (token counts), got dtype {gs.dtype}")
    gs = gs.astype(np.int64)
    if np.any(gs < 0):
        raise ValueError(f"group_sizes must be non-negative token counts, got {gs.tolist()}")
    return gs


@dataclass(frozen=True)
class GmmSituInputs:
    """The operator's arguments, checked once against its contract (contract section 5).

    Layouts are the reference ones: ``x_codes (M, K)`` E4M3 codes, ``x_scales (M, K/32)`` E8M0,
    ``w_packed (E, N, K/2)`` packed E2M1 with rows ``[0, N/2)`` gate_proj and ``[N/2, N)`` up_proj
    (see :func:`stack_w13`), ``w_scales (E, N, K/32)``; ``group_sizes`` holds per-expert token
    counts (expert ``e`` owns the consecutive rows after those of experts ``0..e-1``); ``beta`` and
    ``linear_beta`` are SiTU's parameters. Construction raises ``ValueError`` naming the offending
    argument (K % 64, N % 2, (N/2) % 64, shapes, dtypes, NaN bytes, ``sum(group_sizes) > M``).
    """

    x_codes: np.ndarray
    x_scales: np.ndarray
    w_packed: np.ndarray
    w_scales: np.ndarray
    group_sizes: np.ndarray
    beta: float
    linear_beta: float

    def __post_init__(self) -> None:
        _require_u8("x_codes", self.x_codes, 2)
        _require_u8("x_scales", self.x_scales, 2)
        _require_u8("w_packed", self.w_packed, 3)
        _require_u8("w_scales", self.w_scales, 3)
        m, k = self.x_codes.shape
        if k <= 0 or k % PAIR != 0:
            raise ValueError(f"K must be a positive multiple of {PAIR}, got K={k} (x_codes shape {self.x_codes.shape})")
        if self.x_scales.shape != (m, k // GROUP):
            raise ValueError(
                f"x_scales must have shape {(m, k // GROUP)} for x_codes {self.x_codes.shape}, got {self.x_scales.shape}"
            )
        e, n, k_half = self.w_packed.shape
        if e <= 0:
            raise ValueError(f"w_packed must hold at least one expert, got shape {self.w_packed.shape}")
        if k_half * 2 != k:
            raise ValueError(
                f"w_packed must have shape (E, N, K/2) = (E, N, {k // 2}) for K={k}, got {self.w_packed.shape}"
            )
        if n <= 0 or n % 2 != 0:
            raise ValueError(f"N (w_packed.shape[1]) must be a positive even number, got N={n}")
        if (n // 2) % PAIR != 0:
            raise ValueError(f"N/2 must be a multiple of {PAIR}, got N={n} (N/2={n // 2})")
        if self.w_scales.shape != (e, n, k // GROUP):
            raise ValueError(f"w_scales must have shape {(e, n, k // GROUP)}, got {self.w_scales.shape}")
        nan_codes = np.isin(self.x_codes, np.asarray(constants.E4M3_NAN_CODES, dtype=np.uint8))
        if nan_codes.any():
            raise ValueError(f"x_codes holds {plural(int(nan_codes.sum()), 'E4M3 NaN code')} (0x7F/0xFF)")
        for name, sc in (("x_scales", self.x_scales), ("w_scales", self.w_scales)):
            if (sc == constants.E8M0_NAN).any():
                raise ValueError(f"{name} holds the E8M0 NaN byte {constants.E8M0_NAN}")
        gs = _group_sizes_array(self.group_sizes, e)
        if int(gs.sum()) > m:
            raise ValueError(f"sum(group_sizes) = {int(gs.sum())} exceeds the number of token rows M = {m}")
        object.__setattr__(self, "group_sizes", gs)
        object.__setattr__(self, "beta", _check_positive("beta", self.beta))
        object.__setattr__(self, "linear_beta", _check_positive("linear_beta", self.linear_beta))

    @property
    def m(self) -> int:
        return self.x_codes.shape[0]

    @property
    def n(self) -> int:
        return self.w_packed.shape[1]

    @property
    def tokens(self) -> int:
        """Rows that belong to an expert: ``sum(group_sizes)``."""
        return int(self.group_sizes.sum())


# ---------------------------------------------------------------------------------------------
# the three stages


def dequantize_activations(x_codes: np.ndarray, x_scales: np.ndarray) -> np.ndarray:
    """MXFP8 activations ``(M, K)`` E4M3 codes + ``(M, K/32)`` scales -> float32 ``(M, K)``."""
    return np.asarray(mx.dequantize_mx(x_codes, x_scales, constants.E4M3), dtype=np.float32)


def dequantize_expert_weight(w_packed_e: np.ndarray, w_scales_e: np.ndarray) -> np.ndarray:
    """One expert's packed E2M1 ``(N, K/2)`` + scales ``(N, K/32)`` -> float32 ``(N, K)``."""
    codes = elements.unpack_fp4(w_packed_e)
    return np.asarray(mx.dequantize_mx(codes, w_scales_e, constants.E2M1), dtype=np.float32)


def _expert_row_ranges(group_sizes: np.ndarray):
    start = 0
    for e, count in enumerate(group_sizes.tolist()):
        yield e, start, start + count
        start += count


def grouped_matmul_bf16(
    x_float: np.ndarray,
    w_packed: np.ndarray,
    w_scales: np.ndarray,
    group_sizes,
) -> np.ndarray:
    """Stage 1: per expert ``x_rows @ dequant(W_e)^T`` in float32, rounded to BF16.

    ``x_float`` is the float32 ``(M, K)`` activation the matmul consumes (normally
    :func:`dequantize_activations`; any float32 matrix works, e.g. unquantized BF16 activations
    for a float comparison). Weights are dequantized one expert at a time, and only for experts
    that receive tokens. Returns float32 ``(M, N)`` holding BF16 values; rows at or beyond
    ``sum(group_sizes)`` are zero.
    """
    x_float = np.asarray(x_float, dtype=np.float32)
    e_count, n, _ = w_packed.shape
    gs = _group_sizes_array(group_sizes, e_count)
    m = x_float.shape[0]
    if int(gs.sum()) > m:
        raise ValueError(f"sum(group_sizes) = {int(gs.sum())} exceeds the number of token rows M = {m}")
    h = np.zeros((m, n), dtype=np.float32)
    for e, lo, hi in _expert_row_ranges(gs):
        if hi == lo:
            continue
        w_e = dequantize_expert_weight(w_packed[e], w_scales[e])
        acc = np.matmul(x_float[lo:hi], w_e.T)  # float32 x float32 -> float32 accumulation
        h[lo:hi] = elements.bf16_round(acc.astype(np.float32, copy=False))
    return h


def _sigmoid_f32(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` in float32, literally; ``exp`` overflowing to inf (x < -88.7) gives
    the correct limit 0, so the overflow warning is silenced."""
    one = np.float32(1.0)
    with np.errstate(over="ignore"):
        return (one / (one + np.exp(-x))).astype(np.float32, copy=False)


def situ_bf16(h: np.ndarray, beta: float, linear_beta: float) -> np.ndarray:
    """Stage 2: SiTU of ``(R, N)`` BF16-valued ``h`` in float32 -> float32 ``(R, N/2)`` BF16 values.

    ``gate = h[:, :N/2]``, ``up = h[:, N/2:]``; ``g = beta * tanh(gate / beta) * sigmoid(gate)``,
    ``u = linear_beta * tanh(up / linear_beta)``, result ``bf16_round(g * u)``.
    """
    h = np.asarray(h, dtype=np.float32)
    if h.ndim != 2 or h.shape[1] % 2 != 0:
        raise ValueError(f"h must be 2-D with an even number of columns, got shape {h.shape}")
    b = np.float32(_check_positive("beta", beta))
    lb = np.float32(_check_positive("linear_beta", linear_beta))
    half = h.shape[1] // 2
    gate = h[:, :half]
    up = h[:, half:]
    g = b * np.tanh(gate / b) * _sigmoid_f32(gate)
    u = lb * np.tanh(up / lb)
    return elements.bf16_round((g * u).astype(np.float32, copy=False))


def gmm_situ_float(inputs: GmmSituInputs) -> np.ndarray:
    """Stages 1-2: the BF16 SiTU output before quantization, float32 ``(M, N/2)``.

    Rows at or beyond ``sum(group_sizes)`` are zero.
    """
    out = np.zeros((inputs.m, inputs.n // 2), dtype=np.float32)
    total = inputs.tokens
    if total == 0:
        return out
    x_float = dequantize_activations(inputs.x_codes[:total], inputs.x_scales[:total])
    h = grouped_matmul_bf16(x_float, inputs.w_packed, inputs.w_scales, inputs.group_sizes)
    out[:total] = situ_bf16(h, inputs.beta, inputs.linear_beta)
    return out


def gmm_situ_quant_reference(inputs: GmmSituInputs) -> tuple[np.ndarray, np.ndarray]:
    """The whole golden chain on the CPU.

    Returns ``(y_codes uint8 (M, N/2) E4M3, y_scales uint8 (M, N/2/32) E8M0)``. Rows at or beyond
    ``sum(group_sizes)`` are zero (undefined on the NPU). ``M == 0`` gives empty arrays.
    """
    half = inputs.n // 2
    y_codes = np.zeros((inputs.m, half), dtype=np.uint8)
    y_scales = np.zeros((inputs.m, half // GROUP), dtype=np.uint8)
    total = inputs.tokens
    if total == 0:
        return y_codes, y_scales
    codes, scales = mx.quantize_mx(gmm_situ_float(inputs)[:total], constants.E4M3, "floor")
    y_codes[:total] = codes
    y_scales[:total] = scales
    return y_codes, y_scales


# ---------------------------------------------------------------------------------------------
# test / verify helpers


def make_activations(rng_seed: int, m: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deterministic random MXFP8 activations, as ``npu_dynamic_mx_quant`` would make them.

    Draws ``(M, K)`` values ~ N(0, 1) from ``numpy.random.default_rng(rng_seed)`` in float32,
    rounds them to BF16, and quantizes each row with the ``floor`` rule to E4M3.

    Returns ``(x_codes uint8 (M, K), x_scales uint8 (M, K/32), x_float float32 (M, K))`` where
    ``x_float`` is the BF16 activation **before** quantization (use
    :func:`dequantize_activations` for the quantized values).
    """
    if m < 0 or k <= 0 or k % GROUP != 0:
        raise ValueError(f"need M >= 0 and K a positive multiple of {GROUP}, got M={m}, K={k}")
    rng = np.random.default_rng(rng_seed)
    x_float = elements.bf16_round(rng.standard_normal((m, k), dtype=np.float32))
    x_float = np.asarray(x_float, dtype=np.float32)
    if m == 0:
        return (
            np.zeros((0, k), dtype=np.uint8),
            np.zeros((0, k // GROUP), dtype=np.uint8),
            x_float,
        )
    x_codes, x_scales = mx.quantize_mx(x_float, constants.E4M3, "floor")
    return x_codes, x_scales, x_float


def dynamic_mx_quant(x_float: np.ndarray, fmt: constants.ElementFormat | None, round_mode: str = "rint") -> np.ndarray:
    """What the runtime's dynamic MX quantization makes of activations, dequantized: float32 rows
    ``(M, K)`` quantized per 32 values along K with the ``floor`` rule (``scale_alg`` 0) to ``fmt``
    with ``round_mode`` ("rint" nearest-even, "round" ties away from zero: W4A4_MXFP4's
    activations), or returned as they are when ``fmt`` is None (BF16 activations of an A16 type)."""
    x_float = np.asarray(x_float, dtype=np.float32)
    if fmt is None:
        return x_float
    codes, scales = mx.quantize_mx(x_float, fmt, "floor", round_mode)
    return np.asarray(mx.dequantize_mx(codes, scales, fmt), dtype=np.float32)


def pair_scales(scales: np.ndarray) -> np.ndarray:
    """Weight scale bytes ``(..., N, K/32)`` -> operator layout ``(..., K/64, N, 2)``.

    Groups ``2j`` and ``2j+1`` of row ``n`` become ``[j, n, 0]`` and ``[j, n, 1]``. Requires an
    even number of groups (``K % 64 == 0``). Returns a new C-contiguous array of the same dtype.
    """
    s = np.asarray(scales)
    if s.ndim < 2:
        raise ValueError(f"scales must be at least 2-D (..., N, K/32), got shape {s.shape}")
    n, g = s.shape[-2], s.shape[-1]
    if g % 2 != 0:
        raise ValueError(f"the number of scale groups must be even (K % 64 == 0), got {g}")
    paired = s.reshape(s.shape[:-2] + (n, g // 2, 2))
    return np.ascontiguousarray(np.swapaxes(paired, -3, -2))


def unpair_scales(paired: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pair_scales`: ``(..., K/64, N, 2)`` -> ``(..., N, K/32)``."""
    p = np.asarray(paired)
    if p.ndim < 3 or p.shape[-1] != 2:
        raise ValueError(f"paired scales must have shape (..., K/64, N, 2), got {p.shape}")
    j, n = p.shape[-3], p.shape[-2]
    s = np.swapaxes(p, -3, -2)  # (..., N, K/64, 2)
    return np.ascontiguousarray(s).reshape(p.shape[:-3] + (n, 2 * j))


def pair_activation_scales(scales: np.ndarray) -> np.ndarray:
    """Activation scale bytes ``(M, K/32)`` -> operator layout ``(M, K/64, 2)``.

    Groups ``2j`` and ``2j+1`` of a token row become ``[m, j, 0]`` and ``[m, j, 1]`` (a reshape;
    also the ``y_scale`` layout the operator returns for its ``(M, N/2)`` output).
    """
    s = np.asarray(scales)
    if s.ndim != 2:
        raise ValueError(f"activation scales must be 2-D (M, K/32), got shape {s.shape}")
    m, g = s.shape
    if g % 2 != 0:
        raise ValueError(f"the number of scale groups must be even (K % 64 == 0), got {g}")
    return np.ascontiguousarray(s).reshape(m, g // 2, 2)


def unpair_activation_scales(paired: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pair_activation_scales`: ``(M, K/64, 2)`` -> ``(M, K/32)``."""
    p = np.asarray(paired)
    if p.ndim != 3 or p.shape[-1] != 2:
        raise ValueError(f"paired activation scales must have shape (M, K/64, 2), got {p.shape}")
    return np.ascontiguousarray(p).reshape(p.shape[0], p.shape[1] * 2)


def stack_w13(
    gate_packed: Sequence[np.ndarray],
    gate_scales: Sequence[np.ndarray],
    up_packed: Sequence[np.ndarray],
    up_scales: Sequence[np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Stack a W4A8_MXFP MoE layer's experts into the operator's w13 tensors.

    Each list holds one entry per expert, in expert order: ``*_packed[e]`` is the package's
    ``P.weight`` ``uint8 (I, K/2)`` and ``*_scales[e]`` its ``P.weight_scale`` ``uint8 (I, K/32)``.
    Returns ``(w uint8 (E, 2I, K/2), s uint8 (E, 2I, K/32))``: per expert, the gate rows then the
    up rows.
    """
    lists = {
        "gate_packed": gate_packed,
        "gate_scales": gate_scales,
        "up_packed": up_packed,
        "up_scales": up_scales,
    }
    lengths = {name: len(v) for name, v in lists.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"stack_w13 needs one entry per expert in every list, got lengths {lengths}")
    num_experts = lengths["gate_packed"]
    if num_experts == 0:
        raise ValueError("stack_w13 needs at least one expert")
    ref_w = np.asarray(gate_packed[0])
    ref_s = np.asarray(gate_scales[0])
    if ref_w.ndim != 2 or ref_s.ndim != 2:
        raise ValueError(
            f"expert 0: gate weight and scale must be 2-D, got {ref_w.shape} and {ref_s.shape}"
        )
    inter, k_half = ref_w.shape
    k = 2 * k_half
    if k % GROUP != 0:
        raise ValueError(f"expert 0: K = {k} is not a multiple of {GROUP}")
    want_w = (inter, k_half)
    want_s = (inter, k // GROUP)
    w = np.empty((num_experts, 2 * inter, k_half), dtype=np.uint8)
    s = np.empty((num_experts, 2 * inter, k // GROUP), dtype=np.uint8)
    for e in range(num_experts):
        for name, arr, want in (
            ("gate_packed", gate_packed[e], want_w),
            ("gate_scales", gate_scales[e], want_s),
            ("up_packed", up_packed[e], want_w),
            ("up_scales", up_scales[e], want_s),
        ):
            a = np.asarray(arr)
            if a.dtype != np.uint8:
                raise ValueError(f"{name}[{e}] must have dtype uint8, got {a.dtype}")
            if a.shape != want:
                raise ValueError(f"{name}[{e}] must have shape {want} (as expert 0), got {a.shape}")
        w[e, :inter] = gate_packed[e]
        w[e, inter:] = up_packed[e]
        s[e, :inter] = gate_scales[e]
        s[e, inter:] = up_scales[e]
    return w, s
