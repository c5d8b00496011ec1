"""Counted phrases read in the singular for 1 and in the plural otherwise (errors.plural), in verify's
checks and problems, its three renderers, the package's model card and the numerics' refusals: they
all said "1 shard(s)", "1 problem(s)", "1 check(s) failed"."""

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
