"""What verify once passed in silence: another model's config.json or tokenizer, edited remote code, a
truncated tokenizer.json, a stray model.safetensors.index.json, compression_config, group_size 32.0,
a shard swapped for a link to a huge sparse file; and a package of 100,000 shards, checked in time
linear in their number."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from ascendconv.ascendv1 import INDEX_NAME, PROVENANCE_NAME, SHARD_NAME, SHARD_PATTERN
from ascendconv.io.package import Package
from ascendconv.package_files import strip_quantization_config
from ascendconv.verify import VerifyOptions, verify
from ascendconv.verify.layout import _Layout
from ascendconv.verify.structure import check_files, check_index
from conftest import FIXTURES

DENSE = "qwen3-dense-fp8"
DEEPSEEK = "deepseek-v3-fp8"  # carries remote code (configuration_deepseek.py)


@pytest.fixture
def package(converted, tmp_path):
    def make(fixture: str = DENSE, **options) -> Path:
        target = tmp_path / "pkg"
        shutil.copytree(converted(fixture, max_shard_size=150_000, **options), target)
        return target

    return make


def failed(report) -> dict[str, str]:
    return {c.name: " | ".join(c.problems) for c in report.checks if not c.ok}


def rerecord(pkg: Path, name: str) -> None:
    """Record the file's new digest in the provenance: a consistent package, from another source."""
    prov = json.loads((pkg / PROVENANCE_NAME).read_text())
    prov["files"][name] = hashlib.sha256((pkg / name).read_bytes()).hexdigest()
    (pkg / PROVENANCE_NAME).write_text(json.dumps(prov))


def test_the_provenance_records_every_small_file_and_every_shard_size(package):
    pkg = package()
    prov = json.loads((pkg / PROVENANCE_NAME).read_text())
    others = sorted(p.name for p in pkg.iterdir() if not p.name.endswith(".safetensors") and p.name != PROVENANCE_NAME)
    assert sorted(prov["files"]) == others and "tokenizer.json" in others
    for name, digest in prov["files"].items():
        assert hashlib.sha256((pkg / name).read_bytes()).hexdigest() == digest
    for name, entry in prov["shards"].items():
        assert entry["size"] == (pkg / name).stat().st_size
    report = verify(pkg, VerifyOptions(source=FIXTURES / DENSE))
    assert report.ok and "carried files match the source's" in report.check("copies").detail


def test_a_truncated_tokenizer_fails_without_a_source(package):
    pkg = package()
    data = (pkg / "tokenizer.json").read_bytes()
    (pkg / "tokenizer.json").write_bytes(data[: len(data) // 2])
    problems = failed(verify(pkg))
    assert list(problems) == ["copies"] and "tokenizer.json: sha256" in problems["copies"]


@pytest.mark.parametrize("name, edit", [
    ("config.json", lambda text: text.replace('"qwen3"', '"llama"')),  # another model's config
    ("tokenizer.json", lambda text: text.replace('"<|endoftext|>"', '"<|end|>"', 1)),  # another tokenizer
])
def test_another_models_file_passes_alone_but_fails_against_the_source(package, name, edit):
    pkg = package()
    text = (pkg / name).read_text()
    assert edit(text) != text
    (pkg / name).write_text(edit(text))
    rerecord(pkg, name)
    assert "copies" not in failed(verify(pkg))  # consistent in itself: only the source can tell
    problems = failed(verify(pkg, VerifyOptions(source=FIXTURES / DENSE)))
    assert "copies" in problems and name in problems["copies"]


def test_edited_remote_code_fails_against_the_source(package):
    pkg = package(DEEPSEEK)
    code = pkg / "configuration_deepseek.py"
    code.write_text(code.read_text() + "\nimport os; os.system('true')\n")
    rerecord(pkg, code.name)
    problems = failed(verify(pkg, VerifyOptions(source=FIXTURES / DEEPSEEK)))
    assert "configuration_deepseek.py: differs from the source's" in problems["copies"]


def test_the_package_config_is_the_source_config_without_either_quantization_key(tmp_path, fixture_copy, converted):
    config = {"compression_config": {"quant_method": "fp8"}, "text_config": {"compression_config": {}, "x": 1}, "y": 2}
    assert strip_quantization_config(config) == {"text_config": {"x": 1}, "y": 2}
    src = fixture_copy(DENSE)
    config = json.loads((src / "config.json").read_text())
    config["compression_config"] = {"quant_method": "compressed-tensors"}
    (src / "config.json").write_text(json.dumps(config))
    from ascendconv.convert import ConvertOptions, convert

    convert(src, tmp_path / "out", ConvertOptions())
    assert "compression_config" not in json.loads((tmp_path / "out" / "config.json").read_text())
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    config["compression_config"] = {"quant_method": "fp8"}
    (tmp_path / "out" / "config.json").write_text(json.dumps(config))
    rerecord(tmp_path / "out", "config.json")
    assert "config.json keeps compression_config" in failed(verify(tmp_path / "out"))["config"]


def test_a_float_group_size_fails(package):
    pkg = package()
    description = json.loads((pkg / "quant_model_description.json").read_text())
    description["group_size"] = 32.0
    (pkg / "quant_model_description.json").write_text(json.dumps(description))
    rerecord(pkg, "quant_model_description.json")
    assert "group_size is 32.0, expected the integer 32" in failed(verify(pkg))["description"]
    from ascendconv.inspect import inspect_path

    assert "group_size is 32.0, expected the integer 32 (0 breaks the loader, a float its shapes)" in inspect_path(pkg).problems


def test_a_stray_hf_index_fails(package):
    pkg = package()
    shards = sorted(p.name for p in pkg.glob("*.safetensors"))
    weight_map = json.loads((pkg / INDEX_NAME).read_text())["weight_map"]
    stray = {"metadata": {}, "weight_map": {t: f for t, f in weight_map.items() if f == shards[0]}}
    (pkg / "model.safetensors.index.json").write_text(json.dumps(stray))
    problems = failed(verify(pkg))
    assert "files" in problems and "stray index model.safetensors.index.json" in problems["files"]


def test_a_shard_swapped_for_a_link_to_a_huge_sparse_file_is_not_hashed(package, tmp_path):
    pkg = package()
    shard = sorted(pkg.glob("*.safetensors"))[0]
    huge = tmp_path / "huge"
    with open(huge, "wb") as f:
        f.write(shard.read_bytes()[:4096])  # a plausible start
        f.truncate(50 * 10**9)  # sparse: 50 GB that verify once hashed to the end
    shard.unlink()
    shard.symlink_to(huge)
    report = verify(pkg)
    problems = failed(report)
    assert f"{shard.name}: not hashed" in problems["checksums"]
    assert report.seconds < 60  # a guard against the 50 GB read, not a speed measurement


def test_a_shard_of_another_size_than_recorded_is_not_hashed(package):
    pkg = package()
    prov = json.loads((pkg / PROVENANCE_NAME).read_text())
    shard = sorted(prov["shards"])[0]
    prov["shards"][shard]["size"] += 1
    (pkg / PROVENANCE_NAME).write_text(json.dumps(prov))
    problems = failed(verify(pkg))
    size = (pkg / shard).stat().st_size
    assert f"{shard}: {size} bytes, not the {size + 1} recorded at conversion; not hashed" in problems["checksums"]


def test_shard_names_past_99999_match_the_pattern():
    name = SHARD_NAME.format(100_000, 100_000)
    assert name == "quant_model_weights-100000-of-100000.safetensors" and SHARD_PATTERN.match(name)


def test_a_package_of_100000_shards_is_checked_in_linear_time(tmp_path):
    """The shard bookkeeping of inspect and verify on 100,000 shards, 10 of them missing and 10 stray:
    with list membership this took hours (the counts are quadratic); with sets it is a moment."""
    count = 100_000
    names = [SHARD_NAME.format(i, count) for i in range(1, count + 1)]
    missing = set(names[5000:5010])
    strays = [SHARD_NAME.format(i, count + 1) for i in range(1, 11)]
    (tmp_path / "config.json").write_text("{}")
    pkg = Package(
        root=tmp_path, description={}, fields={}, index={"weight_map": {f"t{i}": n for i, n in enumerate(names)}},
        headers={}, broken_shards={}, tensors={}, expected=names,
        present=sorted([n for n in names if n not in missing] + strays),
    )
    assert sorted(pkg.missing) == sorted(missing) and pkg.strays == strays
    lay = _Layout(pkg)
    problems = check_files(lay).problems
    assert sum("is missing" in p for p in problems) == 10 and sum("stray file" in p for p in problems) == 10
    assert not any("hole" in p for p in problems)  # missing shards are indexed: not holes
    # no headers here: every tensor of a present shard is "held by no shard", those of missing shards are not
    assert len(check_index(lay).problems) == count - 10
    assert len(pkg.disagreements()) == 20


def test_numbering_holes_of_a_count_of_10_to_the_12_are_counted_not_listed(tmp_path):
    names = [SHARD_NAME.format(1, 10**12)]
    (tmp_path / "config.json").write_text("{}")
    pkg = Package(
        root=tmp_path, description={}, fields={}, index={"weight_map": {"t": names[0]}}, headers={}, broken_shards={},
        tensors={}, expected=names, present=names,
    )
    problems = check_files(_Layout(pkg)).problems
    assert sum("has a hole" in p for p in problems) == 20
    assert problems[-1] == f"and {10**12 - 21} more holes in the numbering of {10**12} shards"


def test_a_check_that_compared_nothing_is_skipped_and_counted_apart(package, tmp_path):
    """Against another model's source, exact compares 0 rows: skipped, never passed (accuracy fails:
    it names the weights it could not measure)."""
    from ascendconv.verify.report import VerifyReport

    pkg = package()
    report = verify(pkg, VerifyOptions(source=FIXTURES / DEEPSEEK, exact="sample"))
    assert {"source", "accuracy"} <= set(failed(report))
    check = report.check("exact")
    assert check.skipped and check.ok and "compared nothing" in check.detail, check
    assert report.to_dict()["skipped"] == ["exact"]
    assert report.tally() == f"{len(report.passed)} passed, 1 skipped, {len(report.failed)} failed"
    assert VerifyReport(pkg, report.checks[:3], [], [], [], None, report.options, 0).tally() == "3 passed"


def test_a_linear_described_with_the_experts_type_fails_provenance_without_the_source(package):
    """Under w4a8-mxfp-moe linears are W8A8_MXFP8 and routed experts W4A8_MXFP; the check of the
    recorded scheme took both types as fine for any module, so a w4a8-mxfp package (every linear
    W4A8_MXFP) recorded as w4a8-mxfp-moe passed plain verify. The roles are the planner's."""
    pkg = package("qwen3-moe-fp8", scheme="w4a8-mxfp")
    prov = json.loads((pkg / PROVENANCE_NAME).read_text())
    prov["scheme"] = "w4a8-mxfp-moe"
    (pkg / PROVENANCE_NAME).write_text(json.dumps(prov))
    problems = failed(verify(pkg))
    assert list(problems) == ["provenance"]
    assert problems["provenance"] == (
        f"{PROVENANCE_NAME}: scheme w4a8-mxfp-moe writes W8A8_MXFP8 linears, but 7 linears are described W4A8_MXFP "
        "(e.g. 'model.layers.0.self_attn.k_proj'), which no recorded fallback or override writes: the package was "
        "not converted with the scheme recorded"
    )


def test_shared_experts_taken_as_routed_are_checked_as_experts(converted):
    """--shared-experts-as-routed under w4a16-mxfp4-moe writes the shared experts W4A16_MXFP4 (they are
    loaded into the routed experts' tensor), and verify's alignment check took them for linears:
    'W4A16_MXFP4 is for routed experts only', a package convert wrote failing verify."""
    from ascendconv.decide import Deployment

    pkg = converted(DEEPSEEK, "w4a16-mxfp4-moe", deployment=Deployment(shared_experts_as_routed=True))
    report = verify(pkg)
    assert report.ok, failed(report)
    description = json.loads((pkg / "quant_model_description.json").read_text())
    assert description["model.layers.1.mlp.shared_experts.down_proj.weight"] == "W4A16_MXFP4"
