"""What verify makes of the settings the provenance records: the deployment it checks (and says
where each value came from), and a recorded deployment it cannot read."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.decide import Deployment
from ascendconv.verify import VerifyOptions, verify

runner = CliRunner()
DENSE = "qwen3-dense-fp8"
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
        "recorded": {"tp": 2, "ep": False, "shared_experts_as_routed": False},
    }


@pytest.mark.parametrize("tp", ["8", 0, True, None])
def test_a_recorded_tp_that_is_no_positive_integer_fails_provenance_and_tp(tp2_package, tp):
    edit_deployment(tp2_package, tp=tp)
    report = verify(tp2_package)
    assert {c.name for c in report.failed} == {"provenance", "tp"}
    assert report.check("provenance").problems == [f"{PROVENANCE}: deployment.tp is {tp!r}, expected a positive integer"]
    assert f"deployment.tp is {tp!r}, not a positive integer" in report.check("tp").detail
    assert report.deployment["from"]["tp"] == "unreadable"
    assert verify(tp2_package, VerifyOptions(tp=2)).check("tp").ok  # given, it is checked


def test_a_recorded_ep_that_is_no_bool_fails_provenance(tp2_package):
    edit_deployment(tp2_package, ep="yes")
    report = verify(tp2_package)
    assert [c.name for c in report.failed] == ["provenance"]
    assert report.check("provenance").problems == [f"{PROVENANCE}: deployment.ep is 'yes', expected true or false"]
    assert stdout_lines(tp2_package)[1] == (
        "checked for --tp 2 (as recorded at conversion), --no-ep (the recorded value is unreadable, see provenance)"
    )
