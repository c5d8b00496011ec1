"""What convert refuses or warns about up front, before writing a byte: a --tp its own `verify --tp`
would reject, an --override glob that matches nothing (unless allowed), MTP layers quantized by an
override (a warning, in --json too)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.decide import Deployment, Override
from ascendconv.errors import BadOptionError
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURES
from test_models import DEEPSEEK, deepseek_with_mtp
from test_plan import plan_of

runner = CliRunner()
DENSE = "qwen3-dense-fp8"


def test_a_tp_the_package_could_not_be_served_under_is_refused_naming_the_layers(tmp_path):
    with pytest.raises(BadOptionError, match=r"--tp 3: the package could not be served: ") as refused:
        convert(FIXTURES / DENSE, tmp_path / "out", ConvertOptions(deployment=Deployment(tp=3)))
    assert "model.layers.0.self_attn.q_proj (W8A8_MXFP8, column-parallel): N=128 does not split over 3 ranks" in str(refused.value)
    assert "--override" in refused.value.hint
    assert not (tmp_path / "out").exists()
    result = runner.invoke(app, ["convert", str(FIXTURES / DENSE), str(tmp_path / "out"), "--tp", "3", "--dry-run"])
    assert result.exit_code == 2 and "could not be served" in result.stderr


def test_a_tp_convert_accepts_is_one_its_verify_accepts(tmp_path):
    out = tmp_path / "out"
    convert(FIXTURES / DENSE, out, ConvertOptions(deployment=Deployment(tp=2)))
    report = verify(out, VerifyOptions(tp=2))
    assert report.ok, [(c.name, c.problems) for c in report.failed]


def test_an_override_that_matches_nothing_is_an_error_unless_allowed(tmp_path):
    typo = Override.parse("model.layer.0.*=FLOAT")  # model.layers.0.*
    with pytest.raises(BadOptionError, match=r"--override model.layer.0.\*=FLOAT: matches no linear"):
        convert(FIXTURES / DENSE, tmp_path / "out", ConvertOptions(overrides=[typo]))
    assert not (tmp_path / "out").exists()
    args = ["convert", str(FIXTURES / DENSE), str(tmp_path / "out"), "--override", "model.layer.0.*=FLOAT", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and json.loads(result.stdout.splitlines()[0])["error"] == "BadOptionError"
    assert "--allow-unmatched-override" in json.loads(result.stdout.splitlines()[0])["hint"]
    result = runner.invoke(app, [*args, "--allow-unmatched-override"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["warnings"] == ["--override model.layer.0.*=FLOAT: matches no linear of the source"]
    result = runner.invoke(app, [*args[:-1], "--allow-unmatched-override", "--overwrite"])
    assert result.exit_code == 0 and "warning: --override model.layer.0.*=FLOAT" in " ".join(result.stderr.split())


def test_quantizing_mtp_layers_by_override_warns():
    config = {**DEEPSEEK, "model_type": "deepseek_v32"}
    assert plan_of(deepseek_with_mtp(), config=config).warnings == []
    plan = plan_of(deepseek_with_mtp(), config=config, overrides=[Override.parse("model.layers.1.*=W8A8_MXFP8")])
    assert plan.warnings == ["11 MTP modules quantized by --override: vllm-ascend expects the MTP layer FLOAT"]
    assert plan.to_dict()["warnings"] == plan.warnings  # what --json prints
