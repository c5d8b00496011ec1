"""What verify makes of the settings the provenance records: the deployment it checks (and says
where each value came from), and a recorded deployment it cannot read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.decide import Deployment
from ascendconv.inspect import inspect_path
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURES

runner = CliRunner()
DENSE, MOE, DEEPSEEK = "qwen3-dense-fp8", "qwen3-moe-fp8", "deepseek-v3-fp8"
PROVENANCE = "ascendconv_provenance.json"


@pytest.fixture
def tp2_package(converted, tmp_path):
    target = tmp_path / "pkg"
    shutil.copytree(converted(DENSE, deployment=Deployment(tp=2)), target)
    return target


def edit_deployment(pkg, **fields) -> None:
    prov = json.loads((pkg / PROVENANCE).read_text())
    prov["deployment"].update(fields)
    (pkg / PROVENANCE).write_text(json.dumps(prov))


def stdout_lines(*args) -> list[str]:
    return runner.invoke(app, ["verify", *map(str, args)]).stdout.splitlines()


def test_the_deployment_line_says_which_values_were_given_and_which_recorded(tp2_package):
    assert stdout_lines(tp2_package)[1] == "checked for --tp 2, as recorded at conversion"
    assert stdout_lines(tp2_package, "--tp", "1")[1] == (
        "checked for --tp 1 (given on the command line), --no-ep (as recorded at conversion); converted for --tp 2"
    )
    report = verify(tp2_package, VerifyOptions(tp=1))
    assert (report.options.tp, report.options.ep) == (1, False)
    assert report.to_dict()["deployment"] == {
        "tp": 1, "ep": False, "from": {"tp": "given", "ep": "recorded"},
        "recorded": {"tp": 2, "ep": False, "shared_experts_as_routed": False, "mtp_heads": True},
    }


@pytest.mark.parametrize("tp, kind", [("8", "a string ('8')"), (0, "a number (0)"), (True, "true"), (None, "null")])
def test_a_recorded_tp_that_is_no_positive_integer_fails_provenance_and_tp(tp2_package, tp, kind):
    edit_deployment(tp2_package, tp=tp)
    report = verify(tp2_package)
    assert {c.name for c in report.failed} == {"provenance", "tp"}
    assert report.check("provenance").problems == [f"{PROVENANCE}: deployment.tp is {kind}, expected a positive integer"]
    assert f"deployment.tp is {kind}, not a positive integer" in report.check("tp").detail
    assert report.deployment["from"]["tp"] == "unreadable"
    assert verify(tp2_package, VerifyOptions(tp=2)).check("tp").ok  # given, it is checked


def test_a_recorded_ep_that_is_no_bool_fails_provenance(tp2_package):
    edit_deployment(tp2_package, ep="yes")
    report = verify(tp2_package)
    assert [c.name for c in report.failed] == ["provenance"]
    assert report.check("provenance").problems == [f"{PROVENANCE}: deployment.ep is a string ('yes'), expected true or false"]
    assert stdout_lines(tp2_package)[1] == (
        "checked for --tp 2 (as recorded at conversion), --no-ep (the recorded value is unreadable, see provenance)"
    )


def relabelled(converted, tmp_path, fixture: str, scheme: str, recorded: str):
    """A package converted with `scheme` whose provenance says `recorded`."""
    target = tmp_path / "relabelled"
    shutil.copytree(converted(fixture, scheme), target)
    prov = json.loads((target / PROVENANCE).read_text())
    prov["scheme"] = recorded
    (target / PROVENANCE).write_text(json.dumps(prov))
    return target


@pytest.mark.parametrize("source", [False, True])
def test_a_w8a8_package_recorded_as_w4a8_mxfp_fails_provenance(converted, tmp_path, source):
    pkg = relabelled(converted, tmp_path, MOE, "w8a8-mxfp8", "w4a8-mxfp")
    report = verify(pkg, VerifyOptions(source=FIXTURES / MOE if source else None))
    assert [c.name for c in report.failed] == ["provenance"]
    problem = (
        f"{PROVENANCE}: scheme w4a8-mxfp writes W4A8_MXFP linears and W4A8_MXFP routed experts, but 62 described "
        "tensors are W8A8_MXFP8 (e.g. 'model.layers.0.mlp.experts.0.down_proj.weight'), which no recorded fallback "
        "or override writes: the package was not converted with the scheme recorded"
    )
    assert report.check("provenance").problems == [problem]
    assert problem in inspect_path(pkg).problems  # inspect says so too, instead of "0 fallbacks" alone


def test_a_w4a8_moe_deepseek_package_recorded_as_w8a8_fails_provenance_with_moe_check(converted, tmp_path):
    pkg = relabelled(converted, tmp_path, DEEPSEEK, "w4a8-mxfp-moe", "w8a8-mxfp8")
    report = verify(pkg, VerifyOptions(source=FIXTURES / DEEPSEEK, moe_check=True))
    assert [c.name for c in report.failed] == ["provenance"]
    assert "24 described tensors are W4A8_MXFP" in report.check("provenance").detail


def test_a_relabel_the_types_alone_allow_is_caught_by_the_roles_and_the_recomputed_plan(converted, tmp_path):
    """w4a8-mxfp-moe writes W8A8_MXFP8 too, so the description's types alone do not refute it; the
    modules' roles do (routed experts W4A8_MXFP), and so does its plan on the source."""
    pkg = relabelled(converted, tmp_path, MOE, "w8a8-mxfp8", "w4a8-mxfp-moe")
    plain = verify(pkg)
    assert [c.name for c in plain.failed] == ["provenance"]
    assert plain.check("provenance").problems == [
        f"{PROVENANCE}: scheme w4a8-mxfp-moe writes W4A8_MXFP routed experts, but 24 routed experts are described "
        "W8A8_MXFP8 (e.g. 'model.layers.0.mlp.experts.0.down_proj'), which no recorded fallback or override writes: "
        "the package was not converted with the scheme recorded"
    ]
    report = verify(pkg, VerifyOptions(source=FIXTURES / MOE))
    assert [c.name for c in report.failed] == ["provenance"]
    assert report.check("provenance").problems == [
        f"{PROVENANCE}: scheme w4a8-mxfp-moe (with the recorded overrides and deployment) plans 24 modules of this "
        "source as W4A8_MXFP that the description holds as W8A8_MXFP8 (e.g. 'model.layers.0.mlp.experts.0.down_proj'): "
        "the package was not converted with the scheme recorded"
    ]


def test_an_unknown_recorded_scheme_fails_provenance(converted, tmp_path):
    pkg = relabelled(converted, tmp_path, DENSE, "w8a8-mxfp8", "w8a8-mxfp9")
    assert verify(pkg).check("provenance").detail.startswith(
        f"{PROVENANCE}: scheme is 'w8a8-mxfp9', not one convert writes (w8a8-mxfp8, w4a8-mxfp,"
    )


MISSING = object()  # the field deleted
# A provenance field edited to a JSON type convert never writes there (or deleted), and what verify says
WRONG_TYPES = [
    ("tool", None, "tool is null, expected a string"),
    ("version", 3, "version is a number (3), expected a string"),
    ("version", MISSING, "version is missing, expected a string"),
    ("scheme", {"w8a8-mxfp8": 1}, 'scheme is an object ({"w8a8-mxfp8": 1}), expected a string'),
    ("kernel", ["numba"], 'kernel is a list (["numba"]), expected a string'),
    ("source.name", 5, "source.name is a number (5), expected a string"),
    ("source.quantization_config", None, "source.quantization_config is null, expected a string"),
    ("source.params", [128, 128], "source.params is a list ([128, 128]), expected an object"),
    ("source.files", MISSING, "source.files is missing, expected a list"),
    ("hub", "Qwen/Qwen3-8B", "hub is a string ('Qwen/Qwen3-8B'), expected an object or null"),
    ("hub", {"repo_id": 3, "revision": "a" * 40}, "hub.repo_id is a number (3), expected a string"),
    ("overrides", "*=FLOAT", "overrides is a string ('*=FLOAT'), expected a list"),
    ("fallbacks", [5], "fallbacks[0] is a number (5), expected an object"),
    ("command", 3, "command is a number (3), expected a string"),
    ("added_tensors", [], "added_tensors is a list ([]), expected an object"),
    ("date", None, "date is null, expected a string"),
    ("files", True, "files is true, expected an object"),
    ("checksum", 3, "checksum is a number (3), expected a string"),
]


def edited(pkg, path: str, value) -> None:
    prov = json.loads((pkg / PROVENANCE).read_text())
    *parents, key = path.split(".")
    holder = prov
    for parent in parents:
        holder = holder[parent]
    if value is MISSING:
        del holder[key]
    else:
        holder[key] = value
    (pkg / PROVENANCE).write_text(json.dumps(prov))


@pytest.mark.parametrize("path, value, problem", WRONG_TYPES, ids=[f"{p}={'missing' if v is MISSING else repr(v)}"[:40] for p, v, _ in WRONG_TYPES])
def test_a_provenance_field_of_the_wrong_json_type_fails_plain_verify(converted, tmp_path, path, value, problem):
    pkg = Path(shutil.copytree(converted(DENSE), tmp_path / "pkg"))
    edited(pkg, path, value)
    report = verify(pkg)
    assert [c.name for c in report.failed] == ["provenance"]
    assert report.check("provenance").problems == [f"{PROVENANCE}: {problem}"]


def test_a_recorded_kernel_convert_has_not_fails_plain_verify(converted, tmp_path):
    pkg = Path(shutil.copytree(converted(DENSE), tmp_path / "pkg"))
    edited(pkg, "kernel", "cuda")
    assert verify(pkg).check("provenance").problems == [f"{PROVENANCE}: kernel is 'cuda', expected one of numba, reference"]


OTHER_SOURCE = "this package was converted from another checkpoint, or its provenance was edited; convert again"
# What the provenance says of the source's format, edited, and how verify --source names it
FORMAT_EDITS = [
    ("source.format", "ct-fp8", "source.format is 'ct-fp8', but the source given has 'hf-fp8-block'"),
    ("source.quantization_config", "text_config.quantization_config",
     "source.quantization_config is 'text_config.quantization_config', but the source given has 'quantization_config'"),
    ("source.params", {"weight_block_size": [64, 32]},
     "source.params.weight_block_size is [64, 32], but the source given has [128, 128]"),
    ("source.params", {"weight_block_size": [128, 128], "group_size": 32}, "source.params.group_size is 32, but the source given has none"),
    ("source.params", {}, "source.params.weight_block_size is not recorded, but the source given has [128, 128]"),
]


@pytest.mark.parametrize("path, value, problem", FORMAT_EDITS, ids=[f"{p}={v!r}"[:40] for p, v, _ in FORMAT_EDITS])
def test_a_recorded_source_format_the_source_given_is_not_read_as_fails_provenance(converted, tmp_path, path, value, problem):
    """Values of the right type: only the source tells them wrong, as the same source seam reads it."""
    pkg = Path(shutil.copytree(converted(DENSE), tmp_path / "pkg"))
    edited(pkg, path, value)
    assert verify(pkg).ok
    report = verify(pkg, VerifyOptions(source=FIXTURES / DENSE))
    assert [c.name for c in report.failed] == ["provenance"]
    assert report.check("provenance").problems == [f"{PROVENANCE}: {problem}: {OTHER_SOURCE}"]


def test_the_source_name_hub_and_kernel_are_not_compared_with_the_source(converted, tmp_path):
    """A renamed copy, a snapshot of another revision holding the same bytes and the other kernel
    (the same bytes again) make the same package: none of them is a finding."""
    pkg = Path(shutil.copytree(converted(DENSE), tmp_path / "pkg"))
    edited(pkg, "source.name", "renamed")
    edited(pkg, "hub", {"repo_id": "Qwen/Qwen3-8B-FP8", "revision": "a" * 40})
    edited(pkg, "kernel", "reference")
    assert verify(pkg, VerifyOptions(source=FIXTURES / DENSE)).ok
