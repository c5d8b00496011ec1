"""The registry of verify's checks: each declared once with its stable name and its hint."""

from __future__ import annotations

from dataclasses import dataclass

from ascendconv.errors import clip
from ascendconv.verify.report import Check


@dataclass(frozen=True)
class CheckKind:
    name: str
    family: str  # the module of ascendconv.verify that runs it
    hint: str  # what to do when it fails (empty: the check sets its own)


MAX_PROBLEM_CHARS = 1000
STRUCTURAL_HINT = "fix the structural problems reported by the other checks first; these tensors could not be compared"

# Every check, in the order verify runs them: its stable name (the JSON output and CI scripts use
# it), the family module that runs it, and what to do when it fails.
CHECKS: dict[str, CheckKind] = {
    kind.name: kind
    for kind in (
        CheckKind(
            "files",
            "structure",
            "delete stray *.safetensors files (vLLM loads every one) and stray *.safetensors.index.json files, and "
            "restore missing shards, or convert again",
        ),
        CheckKind(
            "config",
            "structure",
            "remove quantization_config from config.json (and text_config), or convert again",
        ),
        CheckKind(
            "description",
            "structure",
            "quant_model_description.json is damaged or hand-edited; convert again",
        ),
        CheckKind(
            "headers",
            "structure",
            "the shard is truncated or corrupt; copy it again or convert again",
        ),
        CheckKind(
            "index",
            "structure",
            "the index and the shards disagree; convert again (or restore the shard the index names)",
        ),
        CheckKind(
            "coverage",
            "structure",
            "a tensor is missing or unexpected: the loader fills a missing tensor with uninitialised "
            "memory; convert again",
        ),
        CheckKind(
            "dtypes",
            "structure",
            "the loader copies by value into fixed dtypes, so a wrong dtype code silently corrupts the "
            "weights; convert again",
        ),
        CheckKind(
            "shapes",
            "structure",
            "a tensor has the wrong shape for its type; convert again",
        ),
        CheckKind(
            "pairs",
            "structure",
            "every MX weight needs its weight_scale with the same type; convert again",
        ),
        CheckKind(
            "alignment",
            "structure",
            "convert again: convert falls back down each type's chain (e.g. W4A4_MXFP4 -> W4A8_MXFP -> "
            "W8A8_MXFP8 -> FLOAT) for layers that do not align",
        ),
        CheckKind(
            "packed_groups",
            "structure",
            "modules the runtime fuses must share one type; convert again, or use --override on "
            "the whole group",
        ),
        CheckKind(
            "scales",
            "integrity",
            "scale byte 255 is E8M0 NaN and is never written; the shard is corrupt, convert again",
        ),
        CheckKind(
            "payload",
            "integrity",
            "NaN or Inf in the weights; the shard is corrupt, convert again",
        ),
        CheckKind(
            "tp",
            "structure",
            "choose a --tp under which every split aligns, or convert the named layers to a type whose rule "
            "the split meets (e.g. --override 'GLOB=W8A8_MXFP8' or '=FLOAT')",
        ),
        CheckKind(
            "provenance",
            "integrity",
            "ascendconv_provenance.json is damaged; convert again",
        ),
        CheckKind(
            "checksums",
            "integrity",
            "a shard changed after conversion (truncated, bit-flipped or replaced): copy it again or "
            "convert again; pass --no-checksums for a package written by another tool",
        ),
        CheckKind(
            "copies",
            "integrity",
            "a file beside the shards (config.json, tokenizer, remote code, description, index) changed after "
            "conversion or is not the source's: restore it from the source, or convert again",
        ),
        CheckKind(
            "source",
            "accuracy",
            "the package does not match this source: pass the checkpoint it was converted from, or "
            "convert again",
        ),
        CheckKind(
            "accuracy",
            "accuracy",
            "try --scale-rule mse (or rceil), or keep the worst layers in W8A8_MXFP8 / FLOAT with "
            "--override",
        ),
        CheckKind(
            "exact",
            "accuracy",
            "the package bytes differ from the numpy reference under the recorded rule: the kernel that "
            "wrote them is wrong (convert again with --kernel reference) or the shard was modified",
        ),
        CheckKind(
            "moe",
            "moe",
            "the MoE layer output drifts too far from the source: keep experts in W8A8_MXFP8 (--scheme "
            "w8a8-mxfp8) or try another --scale-rule",
        ),
        CheckKind(
            "npu",
            "npu",
            "",
        ),
    )
}


def make_check(name: str, problems: list[str], ok_detail: str, skipped: bool = False) -> Check:
    problems = [clip(p, MAX_PROBLEM_CHARS) for p in problems]  # names and labels come from the files
    if not problems:
        return Check(name, True, clip(ok_detail, MAX_PROBLEM_CHARS), [], "", skipped)
    detail = problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
    return Check(name, False, detail, problems, CHECKS[name].hint)


def skip_check(name: str, why: str) -> Check:
    return Check(name, True, why, [], "", True)

