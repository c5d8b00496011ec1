"""`inspect` and `verify` read a package through one reader (io/package.Package) and must agree on it:
the same tensors, and every damage seen by both, named the same way."""

from __future__ import annotations

import json
import shutil

import pytest

from ascendconv.inspect import inspect_path
from ascendconv.io.package import Package
from ascendconv.verify import VerifyOptions, verify

MOE = "qwen3-moe-fp8"
LAYER0 = "model.layers.0.mlp.experts.0.down_proj"


def stray_model_file(pkg):
    shutil.copyfile(pkg / "quant_model_weights-00001-of-00004.safetensors", pkg / "model.safetensors")
    return "model.safetensors"


def missing_shard(pkg):
    (pkg / "quant_model_weights-00002-of-00004.safetensors").unlink()
    return "quant_model_weights-00002-of-00004.safetensors"


def undescribed_tensor(pkg):
    path = pkg / "quant_model_description.json"
    description = json.loads(path.read_text())
    del description[LAYER0 + ".weight_scale"]
    path.write_text(json.dumps(description))
    return LAYER0 + ".weight_scale"


def index_points_elsewhere(pkg):
    path = pkg / "quant_model_weights.safetensors.index.json"
    index = json.loads(path.read_text())
    file = index["weight_map"][LAYER0 + ".weight"]
    other = next(f for f in sorted(set(index["weight_map"].values())) if f != file)
    index["weight_map"][LAYER0 + ".weight"] = other
    path.write_text(json.dumps(index))
    return LAYER0 + ".weight"


def unknown_type(pkg):
    path = pkg / "quant_model_description.json"
    description = json.loads(path.read_text())
    description[LAYER0 + ".weight"] = "W2A2_MXFP"
    path.write_text(json.dumps(description))
    return "W2A2_MXFP"


@pytest.fixture
def package(converted, tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(converted(MOE, "w4a8-mxfp-moe", max_shard_size=100_000), pkg)
    assert len(list(pkg.glob("quant_model_weights-*-of-00004.safetensors"))) == 4
    return pkg


@pytest.mark.parametrize(
    "damage", [stray_model_file, missing_shard, undescribed_tensor, index_points_elsewhere, unknown_type]
)
def test_inspect_and_verify_agree_on_a_damaged_package(package, damage):
    clean = Package.open(package)
    named = damage(package)
    inspected = inspect_path(package)
    verified = verify(package, VerifyOptions())
    assert inspected.problems and not verified.ok
    assert any(named in p for p in inspected.problems), inspected.problems
    assert any(named in p for c in verified.failed for p in c.problems), [c.problems for c in verified.failed]
    if damage is stray_model_file:  # the stray's tensors are not the package's, for either command
        assert inspected.tensor_count == len(clean.tensors) == len(Package.open(package).tensors)
        assert [c.name for c in verified.failed] == ["files"]
        assert "model.safetensors" not in {s.file for s in inspected.shards}


def test_a_clean_package_is_clean_for_both(package):
    assert inspect_path(package).problems == [] and verify(package, VerifyOptions()).ok
