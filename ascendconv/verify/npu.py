"""--on-npu: the fused op on an Ascend 950 against the CPU reference (the operator is in
ascendconv.npu)."""

from __future__ import annotations

import math

import numpy as np

from ascendconv.errors import NpuUnavailableError, plural
from ascendconv.formats import mx
from ascendconv.formats.constants import E4M3, W4A8_MXFP
from ascendconv.io.rules import moe_layers
from ascendconv.io.safetensors import TensorReader
from ascendconv.npu import reference as gmm_situ
from ascendconv.verify.checks import make_check, skip_check
from ascendconv.verify.layout import _Layout
from ascendconv.verify.moe import (
    _batches,
    _Experts,
    _layer_inputs,
    _layer_problem,
    _rel,
    sample_layers,
    w4a8_batch_inputs,
)
from ascendconv.options import VerifyProgress as Progress, VerifyOptions
from ascendconv.verify.report import Check, NpuReport


def compare_npu_output(
    ref: tuple[np.ndarray, np.ndarray], got: tuple[np.ndarray, np.ndarray]
) -> tuple[float, float, float]:
    """(rel. L2 of the dequantized outputs, share of equal codes, share of equal scale bytes)."""
    (rc, rs), (gc, gs) = ref, got
    a = mx.dequantize_mx(rc, rs, E4M3)
    b = mx.dequantize_mx(gc, gs, E4M3)
    rel = _rel(a, b) if np.isfinite(b).all() else math.nan
    return rel, float(np.mean(rc == gc)) if rc.size else 1.0, float(np.mean(rs == gs)) if rs.size else 1.0


def _npu_layers(lay: _Layout) -> dict[str, dict]:
    """The W4A8_MXFP MoE layers GroupedMatmulSituQuant can run on."""
    w4 = {}
    for layer, names in moe_layers(lay.description, lay.pkg.config).items():
        why, quant_type = _layer_problem(lay, layer, names, None)
        if why is None and quant_type == W4A8_MXFP:
            w4[layer] = names
    return w4


def require_npu(lay: _Layout) -> None:
    """--on-npu on a machine that cannot run the operator is the environment's problem (exit 4),
    told before any other check spends time, never a failed check of the package."""
    from ascendconv import npu

    if not _npu_layers(lay):
        return
    ok, reason = npu.npu_available()
    if not ok:
        raise NpuUnavailableError(f"--on-npu: GroupedMatmulSituQuant cannot run here: {reason}")


def _run_npu(lay: _Layout, options: VerifyOptions, progress: Progress | None) -> tuple[Check, list[NpuReport]]:
    from ascendconv import npu

    w4 = _npu_layers(lay)
    if not w4:
        return skip_check("npu", "no W4A8_MXFP MoE layer: GroupedMatmulSituQuant runs only on W4A8_MXFP experts"), []
    _, reason = npu.npu_available()  # available: require_npu said so before the other checks
    chosen = sample_layers(list(w4), options.moe_layers)
    problems, reports = [], []
    with TensorReader() as reader:
        for i, layer in enumerate(chosen):
            experts = _Experts(lay, reader, None, w4[layer])
            count = max(w4[layer]) + 1
            gate = experts.module(0, "gate_proj")
            x_codes, x_scales, _, counts = _layer_inputs(layer, gate.k, count, options)
            starts = np.concatenate([[0], np.cumsum(counts)])
            active = [e for e in range(count) if counts[e] > 0]
            refs, gots = [], []
            for batch in _batches(active, gate.n * gate.k):
                inputs, _ = w4a8_batch_inputs(experts, batch, starts, x_codes, x_scales, counts, options)
                refs.append(gmm_situ.gmm_situ_quant_reference(inputs))
                try:
                    gots.append(npu.run_gmm_situ_on_npu(inputs))
                except npu.NpuUnavailable as exc:
                    problems.append(f"{layer}: the NPU became unavailable: {exc.reason}")
                    break
                except RuntimeError as exc:  # what torch and torch_npu raise when the operator or device fails
                    problems.append(f"{layer}: GroupedMatmulSituQuant failed on the NPU: {type(exc).__name__}: {exc}")
                    break
            if len(gots) != len(refs):
                continue
            ref = (np.concatenate([r[0] for r in refs]), np.concatenate([r[1] for r in refs]))
            got = (np.concatenate([g[0] for g in gots]), np.concatenate([g[1] for g in gots]))
            rel, codes_equal, scales_equal = compare_npu_output(ref, got)
            passed = bool(rel <= options.npu_tol)
            reports.append(NpuReport(layer, len(active), int(counts.sum()), rel, codes_equal, scales_equal, options.npu_tol, passed))
            if not passed:
                problems.append(
                    f"{layer}: NPU output differs from the CPU reference by rel. error {rel:.4f} > {options.npu_tol:g} "
                    f"({codes_equal:.1%} of codes equal)"
                )
            if progress:
                progress("npu", i + 1, len(chosen))
    detail = f"{plural(len(reports), 'W4A8_MXFP MoE layer')} on {reason}"
    if reports:
        detail += f"; worst rel. error {max(r.rel_err for r in reports):.4f} (tolerance {options.npu_tol:g})"
    check = make_check("npu", problems, detail)
    if problems:
        check.hint = "the fused op disagrees with the CPU reference: check the vllm-ascend / CANN versions"
    return check, reports
