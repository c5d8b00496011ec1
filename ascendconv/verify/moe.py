"""MoE: the GroupedMatmulSituQuant chain on sampled layers, with package and with source experts."""

from __future__ import annotations

import re
from typing import Iterator

import numpy as np

from ascendconv.ascendv1 import QUANT_TYPES, MoeCheck
from ascendconv.errors import plural
from ascendconv.formats import elements
from ascendconv.formats.constants import E4M3, GROUP_SIZE, W4A8_MXFP
from ascendconv.formats.metrics import ErrorAccumulator
from ascendconv.io.rules import moe_layers
from ascendconv.io.safetensors import TensorReader
from ascendconv.npu import reference as gmm_situ
from ascendconv.npu.reference import GmmSituInputs
from ascendconv.sources.rows import decoded
from ascendconv.verify.accuracy import _module_measurable
from ascendconv.verify.checks import STRUCTURAL_HINT, make_check, skip_check
from ascendconv.verify.layout import _Layout, _Module
from ascendconv.verify.rows import _dequantize, _read_package_rows
from ascendconv.options import VerifyProgress as Progress, VerifyOptions
from ascendconv.verify.report import Check, MoeReport


MOE_BATCH_BYTES = 256 * 2**20  # packed w13 bytes per reference / NPU launch


def sample_layers(layers: list[str], count: int) -> list[str]:
    """`count` layers spread evenly from first to last (all when count is 0 or too large)."""
    if count == 0 or count >= len(layers):
        return list(layers)
    picks = np.unique(np.round(np.linspace(0, len(layers) - 1, count)).astype(int))
    return [layers[i] for i in picks]


def routing_counts(seed: int, layer_number: int, tokens: int, experts: int) -> np.ndarray:
    """Deterministic per-expert token counts: `tokens` routed uniformly at random."""
    rng = np.random.default_rng([seed, layer_number, 1])
    return rng.multinomial(tokens, np.full(experts, 1.0 / experts)).astype(np.int64)


def situ_float(x_float: np.ndarray, w13: np.ndarray, beta: float, linear_beta: float) -> np.ndarray:
    """Stages 1-2 of the chain for one expert with float weights ``(2I, K)``: float32 ``(R, I)``
    holding BF16 values (``h`` accumulated in float32 and rounded to BF16, SiTU in float32)."""
    h = elements.bf16_round(np.matmul(x_float, w13.T).astype(np.float32, copy=False))
    return gmm_situ.situ_bf16(h, beta, linear_beta)


def mx_output(y: np.ndarray, check: MoeCheck = QUANT_TYPES[W4A8_MXFP].moe_check) -> np.ndarray:
    """Stage 3 and back: the runtime's dynamic quantization of the SiTU output ``y`` on its way into
    down_proj (the op's floor E4M3 for W4A8_MXFP; per type `check.activation`), dequantized."""
    return gmm_situ.dynamic_mx_quant(y, check.activation, check.inner_round)


def down_float(y: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """The expert's down_proj: ``y (R, I) @ w2 (K, I)^T`` in float32, rounded to BF16."""
    return elements.bf16_round(np.matmul(y, w2.T).astype(np.float32, copy=False))


def _rel(ref: np.ndarray, approx: np.ndarray) -> float:
    acc = ErrorAccumulator()
    acc.update(ref, approx)
    return acc.result().rel_l2


class _Experts:
    """Reads one MoE layer's experts from the package and from the source, on demand."""

    def __init__(self, lay: _Layout, reader: TensorReader, source, names: dict[int, dict[str, str]], by_weight=None):
        self.lay, self.reader, self.source, self.names = lay, reader, source, names
        self.by_weight = by_weight or {}

    def module(self, e: int, proj: str) -> _Module:
        return self.lay.modules[self.names[e][proj][: -len(".weight")]]

    def package_float(self, e: int, proj: str) -> np.ndarray:
        module = self.module(e, proj)
        _, codes, scales = _read_package_rows(self.reader, module, 0, module.n)
        return _dequantize(module, codes, scales)

    def package_packed(self, e: int, proj: str) -> tuple[np.ndarray, np.ndarray]:
        module = self.module(e, proj)
        return self.reader.read(module.weight), self.reader.read(module.scale)

    def source_float(self, e: int, proj: str) -> np.ndarray:
        return decoded(self.source, self.by_weight[self.names[e][proj]])


def _layer_problem(
    lay: _Layout, layer: str, names: dict[int, dict[str, str]], by_weight: dict | None
) -> tuple[str | None, str]:
    """(why the layer cannot be checked or None, its expert type); `by_weight` maps source weight
    names to their linears (None: the package alone is checked)."""
    count = max(names) + 1
    types = set()
    for e in range(count):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            name = names.get(e, {}).get(proj)
            if name is None:
                return f"{layer}: expert {e} has no {proj}", ""
            module = lay.modules.get(name[: -len(".weight")])
            if module is None or module.weight is None:
                return f"{layer}: {name!r} is not stored", ""
            if by_weight is not None:
                linear = by_weight.get(name)
                if linear is None:
                    return f"{layer}: {name!r} is not a quantized linear of the source", ""
                why = _module_measurable(lay, module, linear)
                if why:
                    return f"{layer}: {name!r}: {why}", ""
            types.add(module.label)
    if len(types) != 1:
        return f"{layer}: experts mix types {sorted(types)} (see packed_groups)", ""
    quant_type = types.pop()
    gate = lay.modules[names[0]["gate_proj"][: -len(".weight")]]
    k, inter = gate.k, gate.n
    # the op pairs W4A8_MXFP's scale groups; the float chains quantize activations per 32 values
    need = gmm_situ.PAIR if QUANT_TYPES[quant_type].moe_check.op_reference else GROUP_SIZE
    if k % need or inter % need:
        return f"{layer}: K={k}, I={inter} do not meet the op's alignment (multiples of {need})", quant_type
    return None, quant_type


def _batches(active: list[int], bytes_per_expert: int) -> Iterator[list[int]]:
    per = max(1, MOE_BATCH_BYTES // max(bytes_per_expert, 1))
    for i in range(0, len(active), per):
        yield active[i : i + per]


def _layer_number(layer: str) -> int:
    digits = re.findall(r"\d+", layer)
    return int(digits[-1]) if digits else 0


def _layer_inputs(layer: str, k: int, experts: int, options: VerifyOptions):
    """The layer's activations (MXFP8 codes and scales, and the BF16 values they were made from)
    and per-expert token counts."""
    number = _layer_number(layer)
    x_codes, x_scales, x_bf16 = gmm_situ.make_activations(options.seed * 1_000_003 + number, options.moe_tokens, k)
    counts = routing_counts(options.seed, number, options.moe_tokens, experts)
    return x_codes, x_scales, x_bf16, counts


def chain_input(check: MoeCheck, x_codes: np.ndarray, x_scales: np.ndarray, x_bf16: np.ndarray) -> np.ndarray:
    """The activations gate/up consume at run time under `check`, as float32: MXFP8 (the op's
    input), BF16 as they are (A16), or MXFP4 with the runtime's rounding (W4A4_MXFP4)."""
    if check.activation == E4M3:
        return gmm_situ.dequantize_activations(x_codes, x_scales)
    return gmm_situ.dynamic_mx_quant(x_bf16, check.activation, check.input_round)


def w4a8_batch_inputs(
    experts: _Experts, batch: list[int], starts: np.ndarray, x_codes, x_scales, counts: np.ndarray, options: VerifyOptions
) -> tuple[GmmSituInputs, np.ndarray]:
    """The op's inputs for a batch of W4A8_MXFP experts (their packed gate and up weights stacked,
    the activation rows routed to them), and those rows."""
    packed = [experts.package_packed(e, p) for e in batch for p in ("gate_proj", "up_proj")]
    w13, s13 = gmm_situ.stack_w13(
        [p[0] for p in packed[0::2]], [p[1] for p in packed[0::2]],
        [p[0] for p in packed[1::2]], [p[1] for p in packed[1::2]],
    )
    rows = np.concatenate([np.arange(starts[e], starts[e + 1]) for e in batch])
    return GmmSituInputs(x_codes[rows], x_scales[rows], w13, s13, counts[batch], options.beta, options.linear_beta), rows


def moe_layer_check(
    experts: _Experts, layer: str, quant_type: str, options: VerifyOptions
) -> MoeReport:
    """Run the chain on one layer with the package's and the source's experts; compare the outputs."""
    count = max(experts.names) + 1
    gate = experts.module(0, "gate_proj")
    k, inter = gate.k, gate.n
    check = QUANT_TYPES[quant_type].moe_check
    x_codes, x_scales, x_bf16, counts = _layer_inputs(layer, k, count, options)
    # the source experts see the same activations: the SiTU output error is the weights' alone
    x = chain_input(check, x_codes, x_scales, x_bf16)
    starts = np.concatenate([[0], np.cumsum(counts)])
    active = [e for e in range(count) if counts[e] > 0]
    total = int(counts.sum())
    y_ref = np.zeros((total, inter), np.float32)
    y_pkg = np.zeros((total, inter), np.float32)
    out_ref = np.zeros((total, k), np.float32)
    out_pkg = np.zeros((total, k), np.float32)
    out_bf16 = np.zeros((total, k), np.float32)
    for batch in _batches(active, 2 * inter * k):
        if check.op_reference:
            # the op's CPU reference, stages 1-2 (stage 3 is mx_output below)
            inputs, rows = w4a8_batch_inputs(experts, batch, starts, x_codes, x_scales, counts, options)
            y = gmm_situ.gmm_situ_float(inputs)
            for i, e in enumerate(batch):
                lo = int(np.searchsorted(rows, starts[e]))
                y_pkg[starts[e] : starts[e + 1]] = y[lo : lo + counts[e]]
        for e in batch:
            lo, hi = int(starts[e]), int(starts[e + 1])
            if not check.op_reference:
                w13 = np.concatenate([experts.package_float(e, "gate_proj"), experts.package_float(e, "up_proj")])
                y_pkg[lo:hi] = situ_float(x[lo:hi], w13, options.beta, options.linear_beta)
            w13_src = np.concatenate([experts.source_float(e, "gate_proj"), experts.source_float(e, "up_proj")])
            w2_src = experts.source_float(e, "down_proj")
            y_ref[lo:hi] = situ_float(x[lo:hi], w13_src, options.beta, options.linear_beta)
            out_ref[lo:hi] = down_float(y_ref[lo:hi], w2_src)
            out_bf16[lo:hi] = down_float(situ_float(x_bf16[lo:hi], w13_src, options.beta, options.linear_beta), w2_src)
            out_pkg[lo:hi] = down_float(mx_output(y_pkg[lo:hi], check), experts.package_float(e, "down_proj"))
    path = f"{check.path} ({quant_type} experts)" if check.op_reference else f"{check.path} ({quant_type} dequantized)"
    rel_situ, rel = _rel(y_ref, y_pkg), _rel(out_ref, out_pkg)
    limit = options.moe_limit(quant_type)
    return MoeReport(
        layer, quant_type, path, count, len(active), total, rel_situ, rel, limit, bool(rel <= limit), _rel(out_bf16, out_pkg)
    )


def _run_moe(lay: _Layout, source, options: VerifyOptions, progress: Progress | None) -> tuple[Check, list[MoeReport]]:
    layers = moe_layers(lay.description, lay.pkg.config)
    if not layers:
        return skip_check("moe", "no MoE layers in the package: nothing to check"), []
    chosen = sample_layers(list(layers), options.moe_layers)
    # by the package's weight name (an MX source may store it otherwise: compressed-tensors' weight_packed)
    by_weight = {linear.prefix + ".weight": linear for linear in source.linears.values()}
    problems, reports = [], []
    with TensorReader() as reader:
        for i, layer in enumerate(chosen):
            why, quant_type = _layer_problem(lay, layer, layers[layer], by_weight)
            if why:
                problems.append(f"not checked: {why}")
                continue
            experts = _Experts(lay, reader, source, layers[layer], by_weight)
            report = moe_layer_check(experts, layer, quant_type, options)
            reports.append(report)
            if progress:
                progress("moe", i + 1, len(chosen))
            if not report.ok:
                problems.append(
                    f"{layer} ({quant_type}): MoE output rel. error {report.rel_err:.4f} > {report.max_rel_err:g} "
                    f"(SiTU output {report.rel_err_situ:.4f})"
                )
    detail = f"{len(reports)} of {plural(len(layers), 'MoE layer')}"
    if reports:
        detail += f"; worst output rel. error {max(r.rel_err for r in reports):.4f}"
    check = make_check("moe", problems, detail)
    if problems and all(p.startswith("not checked") for p in problems):
        check.hint = STRUCTURAL_HINT
    return check, reports
