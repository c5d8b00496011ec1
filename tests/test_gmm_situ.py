"""The CPU reference of GroupedMatmulSituQuant (contract section 5) against an independent float64 path,
the scale pairing layouts, input validation, and the CPU-testable parts of the NPU path.

The float64 path below shares no code with the project: element grids, FP4 unpacking, E8M0, the
matmul (math.fsum of exact products), SiTU (math.tanh, 1 / (1 + exp(-x))) and the floor-rule E4M3
quantizer are all written out here.

Tolerances (stated once, used below):
- grouped matmul stage: the reference accumulates in float32 and rounds to BF16 (relative error
  <= 2**-9), so each element is within 2**-8 * |h| + 1e-6 * max|h| of the exact float64 value;
- BF16 SiTU output before quantization: two BF16 roundings plus float32 SiTU; SiTU can amplify
  the relative error of ``gate`` (d ln g / d ln gate ~ 1 + |gate| for negative gate), so each
  element is within 2**-6 * |ref| + 2**-10 * max|ref|, and the whole output within relative L2
  2**-8;
- quantized output: relative L2 of dequantized y against the float64 SiTU output < 0.05 (E4M3
  floor alone costs ~0.03); the float64 output quantized by the independent quantizer agrees
  with the reference in >= 95 % of codes and of scale bytes, and a code that differs under an
  equal scale is one step away ("the float64 output" here is the float64 chain with the contract's
  two BF16 roundings, rounded by an independent bf16_round_64; without them, a group whose
  maximum sits just below a power of two -- common where tanh saturates -- changes binade);
- quantization stage alone: the independent quantizer applied to the reference's own BF16
  intermediate reproduces its bytes exactly.
"""

from __future__ import annotations

import bisect
import math
import subprocess
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascendconv.npu import reference as g
from ascendconv.npu import NpuUnavailable, npu_available, run_gmm_situ_on_npu

# ------------------------------------------------------------------------------------------------
# independent float64 implementation

E2M1_MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_value(code: int) -> float:
    magnitude = E2M1_MAGNITUDES[code & 0x7]
    return -magnitude if code & 0x8 else magnitude


def e4m3_value(code: int) -> float:
    sign = -1.0 if code & 0x80 else 1.0
    exponent = (code >> 3) & 0xF
    mantissa = code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * (mantissa / 8.0) * 2.0**-6
    return sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)


def e8m0_value(byte: int) -> float:
    return 2.0 ** (int(byte) - 127)


# Positive finite E4M3 magnitudes with their codes, ascending (codes 0x00..0x7E).
E4M3_POSITIVE = [(e4m3_value(c), c) for c in range(0x7F)]
E4M3_POSITIVE_VALUES = [v for v, _ in E4M3_POSITIVE]


def e4m3_round(y: float) -> int:
    """Nearest-even E4M3 code of a float, saturating at 448."""
    magnitude = min(abs(y), 448.0)
    i = bisect.bisect_left(E4M3_POSITIVE_VALUES, magnitude)
    if i < len(E4M3_POSITIVE) and E4M3_POSITIVE_VALUES[i] == magnitude:
        code = E4M3_POSITIVE[i][1]
    else:
        (lo_v, lo_c), (hi_v, hi_c) = E4M3_POSITIVE[i - 1], E4M3_POSITIVE[i]
        if magnitude - lo_v < hi_v - magnitude:
            code = lo_c
        elif magnitude - lo_v > hi_v - magnitude:
            code = hi_c
        else:
            code = lo_c if lo_c % 2 == 0 else hi_c
    return code | 0x80 if y < 0 or (y == 0 and math.copysign(1.0, y) < 0) else code


def quantize_floor_e4m3_64(values: np.ndarray):
    """OCP floor rule, E4M3, per row and group of 32, element by element in Python floats."""
    rows, cols = values.shape
    codes = np.zeros((rows, cols), dtype=np.uint8)
    scales = np.zeros((rows, cols // 32), dtype=np.uint8)
    for r in range(rows):
        for grp in range(cols // 32):
            chunk = [float(v) for v in values[r, 32 * grp : 32 * grp + 32]]
            amax = max(abs(v) for v in chunk)
            if amax == 0.0:
                exponent = 0
            else:
                _, e = math.frexp(amax)  # amax = m * 2**e, m in [0.5, 1)
                exponent = max((e - 1 + 127) - 8, 0)
            scales[r, grp] = exponent
            for j, v in enumerate(chunk):
                if exponent == 0:
                    codes[r, 32 * grp + j] = 0x80 if math.copysign(1.0, v) < 0 else 0
                else:
                    codes[r, 32 * grp + j] = e4m3_round(v * 2.0 ** (127 - exponent))
    return codes, scales


def dequant_activations_64(x_codes, x_scales) -> np.ndarray:
    m, k = x_codes.shape
    out = np.zeros((m, k), dtype=np.float64)
    for r in range(m):
        for c in range(k):
            out[r, c] = e4m3_value(int(x_codes[r, c])) * e8m0_value(x_scales[r, c // 32])
    return out


def dequant_weights_64(w_packed, w_scales) -> np.ndarray:
    e_count, n, k_half = w_packed.shape
    out = np.zeros((e_count, n, 2 * k_half), dtype=np.float64)
    for e in range(e_count):
        for row in range(n):
            for j in range(k_half):
                byte = int(w_packed[e, row, j])
                for c, code in ((2 * j, byte & 0xF), (2 * j + 1, byte >> 4)):
                    out[e, row, c] = e2m1_value(code) * e8m0_value(w_scales[e, row, c // 32])
    return out


def grouped_matmul_64(x64, w64, group_sizes) -> np.ndarray:
    m = x64.shape[0]
    n = w64.shape[1]
    h = np.zeros((m, n), dtype=np.float64)
    start = 0
    for e, count in enumerate(group_sizes):
        for r in range(start, start + count):
            xr = x64[r].tolist()
            for col in range(n):
                h[r, col] = math.fsum(a * b for a, b in zip(xr, w64[e, col].tolist()))
        start += count
    return h


def situ_64(h: np.ndarray, beta: float, linear_beta: float) -> np.ndarray:
    half = h.shape[1] // 2
    out = np.zeros((h.shape[0], half), dtype=np.float64)
    for r in range(h.shape[0]):
        for c in range(half):
            gate = float(h[r, c])
            up = float(h[r, half + c])
            sig = 1.0 / (1.0 + math.exp(-gate)) if gate > -700 else 0.0
            gg = beta * math.tanh(gate / beta) * sig
            uu = linear_beta * math.tanh(up / linear_beta)
            out[r, c] = gg * uu
    return out


def bf16_round_64(values: np.ndarray) -> np.ndarray:
    """Round each float to 8 significant bits, nearest-even (normal range only)."""
    out = np.zeros_like(values, dtype=np.float64)
    for idx, v in np.ndenumerate(values):
        if v == 0.0:
            out[idx] = v
            continue
        mantissa, exponent = math.frexp(float(v))  # |mantissa| in [0.5, 1)
        out[idx] = math.ldexp(round(mantissa * 256.0), exponent - 8)  # round(): ties to even
    return out


def e4m3_ordinal(codes: np.ndarray) -> np.ndarray:
    magnitude = (codes & 0x7F).astype(np.int64)
    return np.where(codes & 0x80, -magnitude, magnitude)


def rel_l2(ref: np.ndarray, approx: np.ndarray) -> float:
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(np.asarray(approx, dtype=np.float64) - ref) / np.linalg.norm(ref))


# ------------------------------------------------------------------------------------------------
# cases


def make_case(seed: int, k: int, n: int = 128, m: int = 20, group_sizes=(7, 0, 10)):
    rng = np.random.default_rng(seed)
    e = len(group_sizes)
    x_codes, x_scales, x_float = g.make_activations(seed, m, k)
    w_packed = rng.integers(0, 256, size=(e, n, k // 2), dtype=np.uint8)
    w_scales = rng.integers(120, 127, size=(e, n, k // 32), dtype=np.uint8)
    return x_codes, x_scales, w_packed, w_scales, np.asarray(group_sizes, dtype=np.int64)


CASES = [
    # (seed, K, group_sizes, beta, linear_beta)
    (0, 64, (7, 0, 10), 4.0, 25.0),  # 3 trailing rows beyond sum(group_sizes)
    (1, 128, (0, 12, 8), 1.0, 1.0),
    (2, 128, (5, 9, 0), 0.5, 2.0),
    (3, 64, (20, 0, 0), 4.0, 0.75),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"seed{c[0]}-K{c[1]}-{'_'.join(map(str, c[2]))}")
def case(request):
    seed, k, groups, beta, linear_beta = request.param
    x_codes, x_scales, w_packed, w_scales, gs = make_case(seed, k, group_sizes=groups)
    x64 = dequant_activations_64(x_codes, x_scales)
    w64 = dequant_weights_64(w_packed, w_scales)
    h64 = grouped_matmul_64(x64, w64, gs.tolist())
    out64 = situ_64(h64, beta, linear_beta)
    # the chain of the contract in float64: the same two BF16 roundings, float64 arithmetic elsewhere
    out64_bf16 = bf16_round_64(situ_64(bf16_round_64(h64), beta, linear_beta))
    return types.SimpleNamespace(
        x_codes=x_codes, x_scales=x_scales, w_packed=w_packed, w_scales=w_scales, gs=gs,
        beta=beta, linear_beta=linear_beta, total=int(gs.sum()), h64=h64, out64=out64,
        out64_bf16=out64_bf16, x64=x64,
    )


# ------------------------------------------------------------------------------------------------
# the reference against float64


def test_dequantization_matches_independent_decode(case):
    assert np.array_equal(g.dequantize_activations(case.x_codes, case.x_scales), case.x64)
    w_e = g.dequantize_expert_weight(case.w_packed[1], case.w_scales[1])
    assert w_e.dtype == np.float32
    assert np.array_equal(w_e, dequant_weights_64(case.w_packed[1:2], case.w_scales[1:2])[0])


def test_grouped_matmul_stage_within_bf16(case):
    x = g.dequantize_activations(case.x_codes, case.x_scales)
    h = g.grouped_matmul_bf16(x, case.w_packed, case.w_scales, case.gs)
    assert h.dtype == np.float32 and h.shape == case.h64.shape
    assert np.array_equal(g.elements.bf16_round(h), h)  # BF16 values
    bound = 2.0**-8 * np.abs(case.h64) + 1e-6 * np.abs(case.h64).max()
    assert np.all(np.abs(h - case.h64) <= bound)
    assert not h[case.total :].any()


def test_situ_output_before_quantization_within_bf16(case):
    out = g.gmm_situ_float(g.GmmSituInputs(
        case.x_codes, case.x_scales, case.w_packed, case.w_scales, case.gs, case.beta, case.linear_beta
    ))
    assert out.dtype == np.float32 and out.shape == (case.x_codes.shape[0], 64)
    assert np.array_equal(g.elements.bf16_round(out), out)
    ref = case.out64[: case.total]
    got = out[: case.total]
    bound = 2.0**-6 * np.abs(ref) + 2.0**-10 * np.abs(ref).max()
    assert np.all(np.abs(got - ref) <= bound)
    assert rel_l2(ref, got) < 2.0**-8
    assert not out[case.total :].any()


def test_quantization_stage_is_the_floor_rule_exactly(case):
    out = g.gmm_situ_float(g.GmmSituInputs(
        case.x_codes, case.x_scales, case.w_packed, case.w_scales, case.gs, case.beta, case.linear_beta
    ))
    y, ys = g.gmm_situ_quant_reference(g.GmmSituInputs(
        case.x_codes, case.x_scales, case.w_packed, case.w_scales, case.gs, case.beta, case.linear_beta
    ))
    codes, scales = quantize_floor_e4m3_64(out[: case.total].astype(np.float64))
    assert np.array_equal(y[: case.total], codes)
    assert np.array_equal(ys[: case.total], scales)


def test_quantized_output_against_float64(case):
    y, ys = g.gmm_situ_quant_reference(g.GmmSituInputs(
        case.x_codes, case.x_scales, case.w_packed, case.w_scales, case.gs, case.beta, case.linear_beta
    ))
    m = case.x_codes.shape[0]
    assert y.shape == (m, 64) and y.dtype == np.uint8
    assert ys.shape == (m, 2) and ys.dtype == np.uint8
    # rows beyond sum(group_sizes): zero (undefined on the NPU)
    assert not y[case.total :].any() and not ys[case.total :].any()

    t = case.total
    deq = np.array(
        [[e4m3_value(int(y[r, c])) * e8m0_value(ys[r, c // 32]) for c in range(64)] for r in range(t)]
    )
    assert rel_l2(case.out64[:t], deq) < 0.05

    # Quantize the float64 chain (with its BF16 roundings: without them, groups whose maximum
    # sits just below a power of two, common when tanh saturates, land in another binade).
    codes64, scales64 = quantize_floor_e4m3_64(case.out64_bf16[:t])
    assert np.mean(scales64 == ys[:t]) >= 0.95
    assert np.mean(codes64 == y[:t]) >= 0.95
    same_scale = np.repeat(scales64 == ys[:t], 32, axis=1)
    step = np.abs(e4m3_ordinal(codes64) - e4m3_ordinal(y[:t]))
    assert np.all(step[same_scale] <= 1)


def test_expert_rows_are_consecutive_and_gate_up_order():
    # Expert 1 gets every token; swapping its gate and up halves must change the output, and
    # experts 0 and 2 (no tokens) must not matter.
    x_codes, x_scales, w_packed, w_scales, _ = make_case(11, 64, group_sizes=(0, 20, 0))
    gs = np.array([0, 20, 0])
    y1, s1 = g.gmm_situ_quant_reference(g.GmmSituInputs(x_codes, x_scales, w_packed, w_scales, gs, 4.0, 25.0))
    other = w_packed.copy()
    other[0] ^= 0x11
    other[2] ^= 0x22
    y2, s2 = g.gmm_situ_quant_reference(g.GmmSituInputs(x_codes, x_scales, other, w_scales, gs, 4.0, 25.0))
    assert np.array_equal(y1, y2) and np.array_equal(s1, s2)
    swapped = w_packed.copy()
    swapped[1] = np.concatenate([w_packed[1, 64:], w_packed[1, :64]])
    swapped_s = w_scales.copy()
    swapped_s[1] = np.concatenate([w_scales[1, 64:], w_scales[1, :64]])
    y3, _ = g.gmm_situ_quant_reference(g.GmmSituInputs(x_codes, x_scales, swapped, swapped_s, gs, 4.0, 25.0))
    assert not np.array_equal(y1, y3)


def test_situ_bf16_formula_small():
    h = np.array([[1.0, -2.0, 0.5, 3.0], [0.0, -100.0, -4.0, 100.0]], dtype=np.float32)
    out = g.situ_bf16(h, 4.0, 25.0)
    for r in range(2):
        for c in range(2):
            gate, up = float(h[r, c]), float(h[r, 2 + c])
            want = 4.0 * math.tanh(gate / 4.0) / (1.0 + math.exp(-gate)) * 25.0 * math.tanh(up / 25.0)
            assert abs(out[r, c] - want) <= 2.0**-8 * abs(want) + 1e-30
    assert np.array_equal(g.elements.bf16_round(out), out)


# ------------------------------------------------------------------------------------------------
# edge cases and validation


def test_m_zero_returns_empty():
    x_codes = np.zeros((0, 64), dtype=np.uint8)
    x_scales = np.zeros((0, 2), dtype=np.uint8)
    w = np.zeros((2, 128, 32), dtype=np.uint8)
    ws = np.full((2, 128, 2), 127, dtype=np.uint8)
    y, ys = g.gmm_situ_quant_reference(g.GmmSituInputs(x_codes, x_scales, w, ws, np.array([0, 0]), 1.0, 1.0))
    assert y.shape == (0, 64) and y.dtype == np.uint8
    assert ys.shape == (0, 2) and ys.dtype == np.uint8
    assert g.gmm_situ_float(g.GmmSituInputs(x_codes, x_scales, w, ws, np.array([0, 0]), 1.0, 1.0)).shape == (0, 64)


def test_no_tokens_at_all_gives_zeros():
    x_codes, x_scales, w, ws, _ = make_case(5, 64)
    y, ys = g.gmm_situ_quant_reference(g.GmmSituInputs(x_codes, x_scales, w, ws, np.zeros(3, dtype=np.int64), 1.0, 1.0))
    assert not y.any() and not ys.any()


def _valid():
    x_codes, x_scales, w, ws, gs = make_case(7, 64)
    return dict(x_codes=x_codes, x_scales=x_scales, w_packed=w, w_scales=ws, group_sizes=gs, beta=4.0, linear_beta=25.0)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(x_codes=a["x_codes"][:, :32], x_scales=a["x_scales"][:, :1]), "multiple of 64"),
        (lambda a: a.update(x_codes=a["x_codes"].astype(np.int16)), "uint8"),
        (lambda a: a.update(x_scales=a["x_scales"][:, :1]), "x_scales"),
        (lambda a: a.update(w_packed=a["w_packed"][:, :, :16]), "w_packed"),
        (lambda a: a.update(w_packed=a["w_packed"][:, :127], w_scales=a["w_scales"][:, :127]), "even"),
        (lambda a: a.update(w_packed=a["w_packed"][:, :64], w_scales=a["w_scales"][:, :64]), "N/2"),
        (lambda a: a.update(w_scales=a["w_scales"][:2]), "w_scales"),
        (lambda a: a.update(group_sizes=np.array([7, 0])), "group_sizes"),
        (lambda a: a.update(group_sizes=np.array([7.0, 0.0, 10.0])), "integers"),
        (lambda a: a.update(group_sizes=np.array([7, -1, 10])), "non-negative"),
        (lambda a: a.update(group_sizes=np.array([7, 4, 10])), "exceeds"),
        (lambda a: a.update(beta=0.0), "beta"),
        (lambda a: a.update(beta=-1.0), "beta"),
        (lambda a: a.update(beta=float("nan")), "beta"),
        (lambda a: a.update(linear_beta=0.0), "linear_beta"),
        (lambda a: a["x_codes"].__setitem__((0, 0), 0x7F), "NaN"),
        (lambda a: a["w_scales"].__setitem__((0, 0, 0), 255), "NaN"),
    ],
)
def test_validation_errors(change, message):
    args = _valid()
    change(args)
    with pytest.raises(ValueError, match=message):
        g.gmm_situ_quant_reference(g.GmmSituInputs(**args))
    with pytest.raises(ValueError, match=message):
        g.gmm_situ_float(g.GmmSituInputs(**args))


def test_make_activations_deterministic_and_floor_quantized():
    a = g.make_activations(42, 5, 128)
    b = g.make_activations(42, 5, 128)
    for u, v in zip(a, b):
        assert np.array_equal(u, v)
    x_codes, x_scales, x_float = a
    assert x_codes.shape == (5, 128) and x_scales.shape == (5, 4) and x_float.shape == (5, 128)
    assert x_float.dtype == np.float32 and np.array_equal(g.elements.bf16_round(x_float), x_float)
    assert 0.5 < float(np.std(x_float)) < 1.5
    codes, scales = quantize_floor_e4m3_64(x_float.astype(np.float64))
    assert np.array_equal(codes, x_codes) and np.array_equal(scales, x_scales)
    assert not np.array_equal(g.make_activations(43, 5, 128)[0], x_codes)
    empty = g.make_activations(0, 0, 64)
    assert [t.shape for t in empty] == [(0, 64), (0, 2), (0, 64)]


# ------------------------------------------------------------------------------------------------
# scale layouts


def test_pair_scales_golden():
    s = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)  # (E=2, N=3, K/32=4)
    p = g.pair_scales(s)
    assert p.shape == (2, 2, 3, 2) and p.dtype == np.uint8 and p.flags.c_contiguous
    for e in range(2):
        for n in range(3):
            for j in range(2):
                assert p[e, j, n, 0] == s[e, n, 2 * j]
                assert p[e, j, n, 1] == s[e, n, 2 * j + 1]
    # expert 0 written out: row n = [4n, 4n+1, 4n+2, 4n+3]
    assert p[0].tolist() == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10, 11]]]
    assert np.array_equal(g.unpair_scales(p), s)
    assert np.array_equal(g.pair_scales(s[0]), p[0])  # unbatched (N, K/32)


def test_pair_activation_scales_golden():
    s = np.arange(12, dtype=np.uint8).reshape(3, 4)  # (M=3, K/32=4)
    p = g.pair_activation_scales(s)
    assert p.shape == (3, 2, 2)
    assert p.tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
    assert np.array_equal(g.unpair_activation_scales(p), s)


@settings(max_examples=50, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), max_size=2),
    n=st.integers(1, 5),
    pairs=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_pair_scales_round_trip(batch, n, pairs, seed):
    shape = tuple(batch) + (n, 2 * pairs)
    s = np.random.default_rng(seed).integers(0, 255, size=shape, dtype=np.uint8)
    p = g.pair_scales(s)
    assert p.shape == tuple(batch) + (pairs, n, 2)
    assert np.array_equal(g.unpair_scales(p), s)
    if not batch:
        a = g.pair_activation_scales(s)
        assert np.array_equal(g.unpair_activation_scales(a), s)


def test_pair_scales_rejects_odd_group_count():
    with pytest.raises(ValueError, match="even"):
        g.pair_scales(np.zeros((4, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="even"):
        g.pair_activation_scales(np.zeros((4, 3), dtype=np.uint8))
    with pytest.raises(ValueError):
        g.unpair_scales(np.zeros((4, 3), dtype=np.uint8))


# ------------------------------------------------------------------------------------------------
# stacking a package layer


def test_stack_w13_gate_then_up():
    rng = np.random.default_rng(3)
    e, inter, k = 3, 64, 128
    gate_w = [rng.integers(0, 256, (inter, k // 2), dtype=np.uint8) for _ in range(e)]
    up_w = [rng.integers(0, 256, (inter, k // 2), dtype=np.uint8) for _ in range(e)]
    gate_s = [rng.integers(120, 127, (inter, k // 32), dtype=np.uint8) for _ in range(e)]
    up_s = [rng.integers(120, 127, (inter, k // 32), dtype=np.uint8) for _ in range(e)]
    w, s = g.stack_w13(gate_w, gate_s, up_w, up_s)
    assert w.shape == (e, 2 * inter, k // 2) and s.shape == (e, 2 * inter, k // 32)
    for i in range(e):
        assert np.array_equal(w[i, :inter], gate_w[i]) and np.array_equal(w[i, inter:], up_w[i])
        assert np.array_equal(s[i, :inter], gate_s[i]) and np.array_equal(s[i, inter:], up_s[i])
    # and the stacked tensors feed the reference
    x_codes, x_scales, _ = g.make_activations(1, 6, k)
    y, ys = g.gmm_situ_quant_reference(g.GmmSituInputs(x_codes, x_scales, w, s, np.array([2, 0, 4]), 4.0, 25.0))
    assert y.shape == (6, inter) and ys.shape == (6, inter // 32)


def test_stack_w13_errors():
    a = np.zeros((64, 32), dtype=np.uint8)
    sc = np.zeros((64, 2), dtype=np.uint8)
    with pytest.raises(ValueError, match="one entry per expert"):
        g.stack_w13([a, a], [sc], [a, a], [sc, sc])
    with pytest.raises(ValueError, match="at least one"):
        g.stack_w13([], [], [], [])
    with pytest.raises(ValueError, match=r"up_packed\[1\]"):
        g.stack_w13([a, a], [sc, sc], [a, a[:32]], [sc, sc])
    with pytest.raises(ValueError, match="uint8"):
        g.stack_w13([a, a], [sc, sc.astype(np.int8)], [a, a], [sc, sc])


# ------------------------------------------------------------------------------------------------
# the NPU path, as far as a CPU can test it


def test_importing_npu_does_not_import_torch():
    code = "import sys, ascendconv.npu; assert 'torch' not in sys.modules and 'torch_npu' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_npu_unavailable_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    ok, reason = npu_available()
    assert ok is False and "torch" in reason
    assert issubclass(NpuUnavailable, RuntimeError)
    with pytest.raises(NpuUnavailable, match="torch"):
        run_gmm_situ_on_npu(g.GmmSituInputs(**_valid()))


def test_npu_invalid_inputs_are_value_errors_first(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    args = _valid()
    args["beta"] = -1.0
    with pytest.raises(ValueError, match="beta"):
        run_gmm_situ_on_npu(g.GmmSituInputs(**args))
    with pytest.raises(ValueError, match="weight_format"):
        run_gmm_situ_on_npu(g.GmmSituInputs(**_valid()), weight_format="zz")


def _fake_torch(monkeypatch, *, available=True, name="Ascend950PR", soc=260, torch_npu_ok=True):
    npu = types.SimpleNamespace(
        is_available=lambda: available,
        device_count=lambda: 1 if available else 0,
        get_device_name=lambda i=0: name,
        get_soc_version=lambda: soc,
    )
    torch = types.ModuleType("torch")
    torch.npu = npu
    torch.float8_e4m3fn = object()
    torch.float8_e8m0fnu = object()
    torch.float4_e2m1fn_x2 = object()
    monkeypatch.setitem(sys.modules, "torch", torch)
    if torch_npu_ok:
        tnpu = types.ModuleType("torch_npu")
        tnpu.npu = npu
        monkeypatch.setitem(sys.modules, "torch_npu", tnpu)
    else:
        monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setitem(sys.modules, "vllm_ascend", None)


def test_npu_available_reasons_with_fake_modules(monkeypatch):
    _fake_torch(monkeypatch, torch_npu_ok=False)
    ok, reason = npu_available()
    assert not ok and "torch_npu" in reason

    _fake_torch(monkeypatch, available=False)
    ok, reason = npu_available()
    assert not ok and "no NPU" in reason

    _fake_torch(monkeypatch, name="Ascend910B3", soc=222)
    ok, reason = npu_available()
    assert not ok and "Ascend 950" in reason and "Ascend910B3" in reason

    _fake_torch(monkeypatch)  # an A5, but vllm_ascend is missing
    ok, reason = npu_available()
    assert not ok and "vllm_ascend" in reason
    with pytest.raises(NpuUnavailable, match="vllm_ascend"):
        run_gmm_situ_on_npu(g.GmmSituInputs(**_valid()))


def test_npu_available_more_reasons(monkeypatch):
    _fake_torch(monkeypatch)
    del sys.modules["torch"].float4_e2m1fn_x2
    ok, reason = npu_available()
    assert not ok and "float4_e2m1fn_x2" in reason

    _fake_torch(monkeypatch)
    _fake_vllm_ascend(monkeypatch, available=False)
    ok, reason = npu_available()
    assert not ok and "is_available() is False" in reason

    _fake_torch(monkeypatch)
    _fake_vllm_ascend(monkeypatch, available=True)
    ok, reason = npu_available()
    assert ok, reason


# A CPU stand-in for torch / torch_npu / the vllm-ascend wrapper: tensors are numpy arrays with a
# dtype tag; the fake op checks the layouts it is given and computes with the CPU reference.


class _FakeTensor:
    def __init__(self, array, dtype):
        self.a, self.dtype = array, dtype

    def to(self, device):
        return self

    def view(self, dtype):
        return _FakeTensor(self.a, dtype)

    def transpose(self, i, j):
        return _FakeTensor(np.swapaxes(self.a, i, j), self.dtype)

    def cpu(self):
        return self

    def numpy(self):
        return self.a


def _fake_vllm_ascend(monkeypatch, available=True, calls=None):
    def to_weight_nz(w):
        assert w.dtype == "float4_e2m1fn_x2" and w.a.ndim == 3
        return w.transpose(1, 2)  # (E, K/2, N), as the NZ view presents itself

    def grouped_matmul_situ_quant(x, x_scale, weight, weight_scale, group_list, *, beta, linear_beta,
                                  group_list_type=1, weight_format="nz"):
        assert (x.dtype, x_scale.dtype, weight.dtype, weight_scale.dtype) == (
            "float8_e4m3fn", "float8_e8m0fnu", "float4_e2m1fn_x2", "float8_e8m0fnu")
        assert group_list.a.dtype == np.int64 and group_list_type == 1
        w = np.swapaxes(weight.a, 1, 2) if weight_format == "nz" else weight.a
        ws = g.unpair_scales(weight_scale.a)  # (E, K/64, N, 2) -> (E, N, K/32)
        xs = g.unpair_activation_scales(x_scale.a)  # (M, K/64, 2) -> (M, K/32)
        y, ys = g.gmm_situ_quant_reference(g.GmmSituInputs(x.a, xs, np.ascontiguousarray(w), ws, group_list.a, beta, linear_beta))
        total = int(group_list.a.sum())
        y[total:] = 0xAB  # undefined rows on the NPU
        ys[total:] = 0xCD
        if calls is not None:
            calls.append(weight_format)
        return _FakeTensor(y, "float8_e4m3fn"), _FakeTensor(g.pair_activation_scales(ys), "float8_e8m0fnu")

    wrapper = types.ModuleType("vllm_ascend.ops.grouped_matmul_situ_quant")
    wrapper.is_available = lambda: available
    wrapper.to_weight_nz = to_weight_nz
    wrapper.grouped_matmul_situ_quant = grouped_matmul_situ_quant
    for name in ("vllm_ascend", "vllm_ascend.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm_ascend.ops.grouped_matmul_situ_quant", wrapper)


@pytest.mark.parametrize("weight_format", ["nz", "nd"])
def test_run_gmm_situ_on_npu_data_flow_with_fake_modules(monkeypatch, weight_format):
    import contextlib

    _fake_torch(monkeypatch)
    torch = sys.modules["torch"]
    for name in ("float8_e4m3fn", "float8_e8m0fnu", "float4_e2m1fn_x2", "uint8"):
        setattr(torch, name, name)
    torch.from_numpy = lambda a: _FakeTensor(a, str(a.dtype))
    torch.device = lambda kind, index: f"{kind}:{index}"
    torch.inference_mode = contextlib.nullcontext
    torch.npu.current_device = lambda: 0
    torch.npu.synchronize = lambda: None
    calls = []
    _fake_vllm_ascend(monkeypatch, calls=calls)

    args = _valid()  # 20 rows, group sizes (7, 0, 10): 3 undefined rows
    y, ys = run_gmm_situ_on_npu(g.GmmSituInputs(**args), weight_format=weight_format)
    want_y, want_ys = g.gmm_situ_quant_reference(g.GmmSituInputs(**args))
    assert calls == [weight_format]
    assert y.dtype == np.uint8 and ys.dtype == np.uint8
    assert np.array_equal(y, want_y) and np.array_equal(ys, want_ys)
