"""Counted phrases read in the singular for 1 and in the plural otherwise (errors.plural), in verify's
checks and problems, its three renderers, the package's model card and the numerics' refusals: they
all said "1 shard(s)", "1 problem(s)", "1 check(s) failed". The tests below the rule drive a real run
to the one: a checkpoint of one linear, a MoE of one expert, one head, one MoE layer, one try."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from ascendconv.cli.render import report_html, report_md
from ascendconv.cli.render.report_data import verdict
from ascendconv.cli.render.verify import render_verify
from ascendconv.decide import Override
from ascendconv.formats import mx
from ascendconv.formats.constants import E4M3
from ascendconv.npu import reference as gmm_situ
from ascendconv.verify import VerifyOptions, verify
from ascendconv.verify import accuracy as verify_accuracy, integrity as verify_integrity
from ascendconv.verify.report import Check, VerifyReport
from conftest import FIXTURES

DENSE, MOE = "qwen3-dense-fp8", "qwen3-moe-fp8"
SHARD_LIMIT = 150_000  # the dense fixture in 5 shards


def details(pkg: Path, **options) -> dict[str, str]:
    return {c.name: c.detail for c in verify(pkg, VerifyOptions(**options)).checks}


def test_one_shard_and_several_in_verify_details_and_the_model_card(converted):
    one, five = details(converted(DENSE)), details(converted(DENSE, max_shard_size=SHARD_LIMIT))
    assert one["files"] == "1 shard, no stray *.safetensors"
    assert five["files"] == "5 shards, no stray *.safetensors"
    assert one["headers"] == "1 shard header valid, offsets in bounds"
    assert five["headers"] == "5 shard headers valid, offsets in bounds"
    rest = " the blake3 recorded at conversion: {} the bytes written then, unless shard and provenance were both " \
           "rewritten (only --source can tell)"
    assert one["checksums"] == "1 shard matches" + rest.format("it holds")
    assert five["checksums"] == "5 shards match" + rest.format("they hold")
    vouched = " (1 shard not scanned: its checksum matches, so it holds the bytes convert wrote and checked)"
    assert one["scales"] == "no E8M0 scale byte is 255" + vouched
    vouched = " (5 shards not scanned: their checksums match, so they hold the bytes convert wrote and checked)"
    assert five["scales"] == "no E8M0 scale byte is 255" + vouched
    assert " in 1 shard |\n" in (converted(DENSE) / "README.md").read_text()
    assert " in 5 shards |\n" in (converted(DENSE, max_shard_size=SHARD_LIMIT) / "README.md").read_text()


def test_packed_groups_moe_layers_and_copied_files_are_counted(converted):
    prov = json.loads((converted(DENSE) / "ascendconv_provenance.json").read_text())
    files = len(prov["files"])
    assert files > 1
    dense = details(converted(DENSE), source=FIXTURES / DENSE)
    moe = details(converted(MOE), source=FIXTURES / MOE, moe_check=True)
    assert dense["packed_groups"] == "4 packed groups and 0 MoE layers, each of one type"
    assert moe["packed_groups"] == "2 packed groups and 2 MoE layers, each of one type"
    assert moe["moe"].startswith("2 of 2 MoE layers; worst output rel. error ")
    assert dense["copies"].startswith(f"{files} files have the sha256 recorded at conversion; ")
    assert dense["copies"].endswith(" carried files match the source's")


def test_scan_findings_in_the_singular_and_the_plural():
    findings = verify_integrity._ScanFindings()
    findings.vouched = {"a.safetensors", "b.safetensors"}
    assert findings.detail("x") == "x (2 shards not scanned: their checksums match, so they hold the bytes convert wrote and checked)"
    findings.vouched = set()
    findings.carried, findings.nonfinite = {"t": 1}, {"t": 1}
    carried = "no NaN codes in FP8 payloads, no NaN/Inf in floats but the {} the source held (recorded at conversion)"
    assert verify_integrity.check_payload(findings).detail == carried.format("1 NaN/Inf value in 1 FLOAT tensor")
    findings.carried, findings.nonfinite = {"t": 1, "u": 2}, {"t": 1, "u": 2}
    assert verify_integrity.check_payload(findings).detail == carried.format("3 NaN/Inf values in 2 FLOAT tensors")
    findings.carried, findings.nonfinite = {"t": 2}, {"t": 1}
    assert verify_integrity.check_payload(findings).problems == [
        "'t' holds 1 NaN/Inf value; the source held 2 (recorded at conversion)"
    ]
    findings.carried, findings.nonfinite = {"t": 1}, {"t": 2}
    assert verify_integrity.check_payload(findings).problems == [
        "'t' holds 2 NaN/Inf values; the source held 1 (recorded at conversion)"
    ]


@pytest.mark.parametrize(("changed", "words"), [
    ([(0, 3)], "1 byte in 1 row differs"),
    ([(0, 3), (0, 5)], "2 bytes in 1 row differ"),
    ([(0, 3), (1, 5)], "2 bytes in 2 rows differ"),
])
def test_bytes_that_differ_from_the_reference(changed, words):
    want = np.zeros((2, 8), dtype=np.uint8)
    got = want.copy()
    for row, byte in changed:
        got[row, byte] = 1
    differences = verify_accuracy._Differences("w", "payload")
    differences.update(got, want, np.array([10, 11]))
    assert differences.message() == (
        f"'w' payload: {words} from the reference; first at row 10, byte 3: package 0x01, reference 0x00"
    )


def report_of(checks: list[Check]) -> VerifyReport:
    return VerifyReport(Path("pkg"), checks, [], [], [], None, VerifyOptions(), 0.5)


ONE_FAILED = [Check("files", True, "fine"), Check("config", False, "bad", ["p"])]
TWO_FAILED = [Check("config", False, "bad", ["p", "q"]), Check("copies", False, "bad", ["r"])]


def test_verdicts_count_their_checks():
    assert verdict({"ok": True, "checks": [{"ok": True}]}) == "OK: 1 check passed"
    assert verdict({"ok": True, "checks": [{"ok": True}, {"ok": True}]}) == "OK: 2 checks passed"
    assert verdict(report_of(ONE_FAILED).to_dict()) == "FAILED: 1 check failed: config"
    assert verdict(report_of(TWO_FAILED).to_dict()) == "FAILED: 2 checks failed: config, copies"


def terminal(checks: list[Check]) -> str:
    text = io.StringIO()
    render_verify(report_of(checks), Console(file=text, width=200, color_system=None))
    return text.getvalue()


def test_the_terminal_counts_problems_and_failed_checks():
    one, two = terminal(ONE_FAILED), terminal(TWO_FAILED)
    assert "config: 1 problem\n" in one and "FAILED: 1 check failed: config\n" in one
    assert "config: 2 problems\n" in two and "copies: 1 problem\n" in two
    assert "FAILED: 2 checks failed: config, copies\n" in two


def test_the_report_files_count_problems():
    md, page = io.StringIO(), io.StringIO()
    report_md.render(report_of(TWO_FAILED).to_dict(), md)
    report_html.render(report_of(TWO_FAILED).to_dict(), page)
    assert "**`config`**: 2 problems\n" in md.getvalue() and "**`copies`**: 1 problem\n" in md.getvalue()
    assert "<summary>2 problems</summary>" in page.getvalue() and "<summary>1 problem</summary>" in page.getvalue()


def test_the_numerics_count_nan_values_and_codes():
    values = np.zeros((1, 32), dtype=np.float32)
    values[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"^non-finite input to MX quantization: NaN/Inf count 1$"):
        mx.quantize_mx(values, E4M3, "floor")
    values[0, 1] = np.inf
    with pytest.raises(ValueError, match=r"^non-finite input to MX quantization: NaN/Inf count 2$"):
        mx.quantize_mx(values, E4M3, "floor")
    x_codes, x_scales, _ = gmm_situ.make_activations(1, 4, 64)
    args = (np.zeros((1, 128, 32), np.uint8), np.full((1, 128, 2), 127, np.uint8), np.array([4]), 4.0, 25.0)
    x_codes[0, 0] = 0x7F
    with pytest.raises(ValueError, match=r"^x_codes holds 1 E4M3 NaN code \(0x7F/0xFF\)$"):
        gmm_situ.GmmSituInputs(x_codes, x_scales, *args)
    x_codes[1, 0] = 0xFF
    with pytest.raises(ValueError, match=r"^x_codes holds 2 E4M3 NaN codes \(0x7F/0xFF\)$"):
        gmm_situ.GmmSituInputs(x_codes, x_scales, *args)


# --- a count of one where a real run meets it --------------------------------------------------

def one_linear(root: Path) -> Path:
    """The dense fixture with one linear left (o_proj, row-parallel), nothing else: what a toy or
    a test model holds (one layer, as its config says: verify fails a package missing a layer)."""
    from test_source_formats import respell

    keep = "model.layers.0.self_attn.o_proj."
    return respell(
        FIXTURES / DENSE, root / "src", lambda name, entry: {name: entry} if name.startswith(keep) else {},
        lambda c: {**c, "num_hidden_layers": 1},
    )


def test_a_checkpoint_of_one_linear_is_counted_in_the_singular(tmp_path):
    from typer.testing import CliRunner

    from ascendconv.cli import app

    runner = CliRunner()
    src = one_linear(tmp_path)
    assert ", 1 quantizable linear\n" in runner.invoke(app, ["inspect", str(src)]).stdout
    out = tmp_path / "out"  # written FLOAT: its one tensor, the weight in BF16
    converted = runner.invoke(app, ["convert", str(src), str(out), "--override", "*=FLOAT"])
    assert converted.exit_code == 0, converted.output
    assert ": 1 tensor (1 FLOAT); " in converted.stdout
    report = verify(out, VerifyOptions(source=src, tp=2))
    assert report.ok, [c.to_dict() for c in report.failed]
    assert {c.name: c.detail for c in report.checks if c.name in ("description", "index", "coverage", "tp", "accuracy")} == {
        "description": "1 entry, model_quant_type FLOAT",
        "index": "1 entry, total_size 65536",
        "coverage": "1 tensor, each described and stored once",
        "tp": "1 split linear aligns under --tp 2",
        "accuracy": "1 weight measured",
    }
    text, md, page = io.StringIO(), io.StringIO(), io.StringIO()
    render_verify(report, Console(file=text, width=200, color_system=None))
    report_md.render(report.to_dict(), md)
    report_html.render(report.to_dict(), page)
    assert "\nworst 1 of 1 weight\n" in text.getvalue()
    assert "\n### Worst 1 of 1 weight\n" in md.getvalue() and "<h2>Worst 1 of 1 weight</h2>" in page.getvalue()


def test_a_moe_of_one_routed_expert(tmp_path):
    import re

    from typer.testing import CliRunner

    from ascendconv.cli import app
    from test_source_formats import respell

    src = respell(FIXTURES / MOE, tmp_path / "src", lambda name, entry: {} if re.search(r"\.experts\.[1-9]", name) else {name: entry},
                  lambda c: {**c, "num_experts": 1, "num_experts_per_tok": 1})
    assert "structure     2 layers, 1 routed expert in 2 MoE layers\n" in CliRunner().invoke(app, ["inspect", str(src)]).stdout


def test_one_re_laid_mx_weight(tmp_path):
    from ascendconv.convert import ConvertOptions, convert
    from mx_sources import MXFP8, as_mx

    src = as_mx(one_linear(tmp_path), tmp_path / "mx", "ct", lambda prefix: MXFP8)
    convert(src, tmp_path / "out", ConvertOptions(scheme="native"))
    exact = verify(tmp_path / "out", VerifyOptions(source=src)).check("exact")
    # only the re-layout is said: no row was re-derived (it read "every row (0 rows) re-derived ... equal the package bytes; ")
    assert exact.detail == "1 re-laid MX weight equals its source bytes through the named transform, every row"


def test_one_more_kind_of_fallback_than_the_card_and_the_markdown_report_list(tmp_path, monkeypatch):
    """Two kinds of fallback (k_proj and v_proj, packed with a q_proj asked FLOAT) where one is listed."""
    from ascendconv import package_files
    from ascendconv.convert import ConvertOptions, convert

    monkeypatch.setattr(package_files, "CARD_FALLBACKS_LISTED", 1)
    pkg = tmp_path / "out"
    convert(FIXTURES / DENSE, pkg, ConvertOptions(overrides=[Override.parse("*q_proj=FLOAT")]))
    assert "\n… and 1 more kind: every fallback is in `ascendconv_provenance.json`.\n" in (pkg / "README.md").read_text()
    monkeypatch.setattr(report_md, "GROUPS_LISTED", 1)
    md = io.StringIO()
    report_md.render(verify(pkg, VerifyOptions()).to_dict(), md)
    assert "\n… and 1 more kind (see the HTML report or `verify --json`)\n" in md.getvalue()


def test_one_more_hole_in_the_shard_numbering_than_listed(tmp_path):
    from ascendconv.ascendv1 import SHARD_NAME
    from ascendconv.io.package import Package
    from ascendconv.verify.layout import _Layout
    from ascendconv.verify.structure import MAX_HOLES_LISTED, check_files

    total = MAX_HOLES_LISTED + 2  # shard 1 present: one hole more than are listed
    names = [SHARD_NAME.format(1, total)]
    (tmp_path / "config.json").write_text("{}")
    pkg = Package(root=tmp_path, description={}, fields={}, index={"weight_map": {"t": names[0]}}, headers={},
                  broken_shards={}, tensors={}, expected=names, present=names)
    assert check_files(_Layout(pkg)).problems[-1] == f"and 1 more hole in the numbering of {total} shards"


def test_the_plan_counts_one_mtp_module_one_moe_layer_and_one_mla_layer():
    from ascendconv.decide import Deployment
    from ascendconv.inspect.source import runtime_notes
    from test_models import DEEPSEEK, deepseek_with_mtp
    from test_plan import fp8, plan_of

    mtp = plan_of(deepseek_with_mtp(), config={**DEEPSEEK, "model_type": "deepseek_v32"},
                  overrides=[Override.parse("model.layers.1.self_attn.kv_b_proj=W8A8_MXFP8")])
    assert mtp.warnings == ["1 MTP module quantized by --override: vllm-ascend expects the MTP layer FLOAT"]
    # (the linears are a layer's every expert projection: never one)
    experts = {n: e for p in ("gate_proj", "up_proj", "down_proj") for n, e in fp8(f"model.layers.0.mlp.experts.0.{p}", 256, 256).items()}
    plan = plan_of(experts, scheme="w4a8-mxfp-moe", deployment=Deployment(tp=8))
    assert [w for w in plan.warnings if w.startswith(
        "--tp 8 splits the routed experts' K below what W4A8_MXFP accepts: 3 expert linears in 1 MoE layer are written FLOAT, ")]
    # one MLA layer whose q_a_proj / kv_a_proj_with_mqa are W4A4: the fused prolog is off in 1 of 1 layer
    layer = {n: e for n, e in deepseek_with_mtp().items() if n.startswith("model.layers.0.")}
    plan = plan_of(layer, config={**DEEPSEEK, "num_nextn_predict_layers": 0}, scheme="w4a4-mxfp4")
    assert "fused MLA prolog (VLLM_ASCEND_ENABLE_MLAPO) off in 1 of 1 layer: q_a_proj/kv_a_proj_with_mqa are W4A4_MXFP4, " \
           "it needs W8A8_MXFP8" in runtime_notes(plan)


def test_one_attention_head_does_not_divide_over_two_ranks(tmp_path):
    from ascendconv.decide import Deployment
    from ascendconv.inspect import inspect_path
    from test_source_formats import respell

    src = respell(FIXTURES / DENSE, tmp_path / "src", lambda name, entry: {name: entry}, lambda c: {**c, "num_attention_heads": 1})
    assert "config.json: 1 attention head does not divide over 2 ranks, and vLLM refuses such a deployment" in \
        inspect_path(src, deployment=Deployment(tp=2)).warnings


def test_a_part_that_failed_its_one_try_says_once():
    """--ray-retries 0: a part whose worker died failed 1 time. Ray's get and its error classes
    stand in (the task itself is not what is counted)."""
    from types import SimpleNamespace

    from ascendconv.cluster import _result_of
    from ascendconv.errors import PartFailedError

    class RayError(Exception):
        pass

    class RayTaskError(RayError):
        pass

    def get(ref):
        raise RayError("the worker died")

    ray = SimpleNamespace(get=get, exceptions=SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError))
    with pytest.raises(PartFailedError, match=r"^part 1/2 failed 1 time; last: the worker died$"):
        _result_of(ray, object(), 1, 2, 0)
    with pytest.raises(PartFailedError, match=r"^part 1/2 failed 3 times; last: the worker died$"):
        _result_of(ray, object(), 1, 2, 2)
