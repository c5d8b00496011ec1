"""A user's journey around the tool: CI heartbeats, one JSON envelope for every command and error,
a package that explains itself (model card, provenance), and the small habits of a command line
(-h, "did you mean", errors that say what the input is)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascendconv.ascendv1 import QUANT_TYPES, Provenance
from ascendconv.cli import app
from ascendconv.cli.progress import HEARTBEAT_SECONDS, Heartbeat
from ascendconv.convert import ConvertOptions, convert
from ascendconv.package_files import convert_command
from conftest import FIXTURES

runner = CliRunner()
MOE = FIXTURES / "qwen3-moe-fp8"


def cli(*args, env: dict | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def module_cli(*args, **kw) -> subprocess.CompletedProcess:
    """The installed command line in its own process: stdout and stderr are pipes, not a terminal."""
    return subprocess.run([sys.executable, "-m", "ascendconv", *map(str, args)], capture_output=True, text=True,
                          timeout=300, **kw)


# --- heartbeat ---------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_heartbeat_prints_a_line_per_shard_and_every_30_seconds_between():
    clock, lines = Clock(), []
    beat = Heartbeat("converting", lines.append, clock)
    clock.now += 10
    beat.bytes(100 * 2**20, 400 * 2**20)
    assert lines == []  # not yet due
    clock.now += HEARTBEAT_SECONDS
    beat.bytes(200 * 2**20, 400 * 2**20)
    # the rate counts from the first report (what came before it was start-up): 100 MiB in 30 s
    assert lines == ["converting: 200.00 MiB of 400.00 MiB (50%), 3.33 MiB/s, ETA 1m00s"]
    beat.shard(1, 3)
    assert lines[-1] == "converting: shard 1/3, 200.00 MiB of 400.00 MiB (50%), 3.33 MiB/s, ETA 1m00s"
    clock.now += 3600 * 3  # 200 MiB in 10,830 s: 100 MiB more take 5,415 s
    beat.bytes(300 * 2**20, 400 * 2**20)
    assert lines[-1].endswith("ETA 1h30m") and "shard 1/3" in lines[-1]


def test_heartbeat_of_verify_counts_layers_in_the_moe_phase():
    clock, lines = Clock(), []
    beat = Heartbeat("verifying", lines.append, clock)
    beat.phase("scanning shards", 2**20, 2**21)
    beat.phase("MoE layers", 1, 4)
    assert lines == ["scanning shards: 1.00 MiB of 2.00 MiB (50%)", "MoE layers: 1 of 4 (25%)"]


def test_a_ci_log_gets_heartbeat_lines_from_convert_and_verify(tmp_path):
    out = tmp_path / "out"
    done = module_cli("convert", MOE, out, "--scheme", "w4a8-mxfp-moe", "--max-shard-size", "100KB")
    assert done.returncode == 0, done.stderr
    beats = [line for line in done.stderr.splitlines() if line.startswith("converting: ")]
    shards = sorted(out.glob("quant_model_weights-*.safetensors"))
    assert [re.match(r"converting: shard (\d+)/(\d+), ", b).groups() for b in beats] == [
        (str(i), str(len(shards))) for i in range(1, len(shards) + 1)
    ]
    assert "\r" not in done.stderr and beats[-1].split(", ")[1].endswith("(100%)")
    checked = module_cli("verify", out, "--source", MOE, "--moe-check")
    assert checked.returncode == 0, checked.stderr
    phases = [line.split(":")[0] for line in checked.stderr.splitlines()]
    # the source is hashed as it is compared, in one pass (each byte read once)
    assert phases == ["scanning shards", "comparing with source", "MoE layers"]
    quiet = module_cli("verify", out, "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_ci_log_gets_a_heartbeat_line_per_shard_from_assemble(tmp_path):
    parts = [tmp_path / f"p{i}" for i in (1, 2)]
    for i, part in enumerate(parts, 1):
        assert cli("convert", MOE, part, "--part", f"{i}/2", "--max-shard-size", "100KB", "--quiet").exit_code == 0
    done = module_cli("assemble", tmp_path / "out", *parts)
    assert done.returncode == 0, done.stderr
    count = len(list((tmp_path / "out").glob("quant_model_weights-*.safetensors")))
    beats = [re.match(r"checking parts: shard (\d+)/(\d+), ", line) for line in done.stderr.splitlines()]
    assert [b.groups() for b in beats] == [(str(i), str(count)) for i in range(1, count + 1)]
    assert done.stderr.splitlines()[-1].endswith("(100%)")


# --- the JSON envelope -------------------------------------------------------------------------


def test_every_command_answers_json_in_one_envelope(tmp_path):
    converted = module_cli("convert", MOE, tmp_path / "pkg", "--json", "--quiet")
    assert converted.returncode == 0, converted.stderr
    data = json.loads(converted.stdout)
    assert (data["ok"], data["schema"], data["command"], data["output"]) == (True, 1, "convert", str(tmp_path / "pkg"))
    # what a CI job writes: `ascendconv convert ... --json | jq -e .ok`
    assert subprocess.run([sys.executable, "-c", "import json,sys; sys.exit(0 if json.load(sys.stdin)['ok'] else 1)"],
                          input=converted.stdout, text=True).returncode == 0
    for args, command in ((["inspect", tmp_path / "pkg"], "inspect"), (["verify", tmp_path / "pkg"], "verify")):
        data = json.loads(cli(*args, "--json").stdout)
        assert (data["ok"], data["schema"], data["command"]) == (True, 1, command)
    parts = [tmp_path / "p1", tmp_path / "p2"]
    for i, part in enumerate(parts, 1):
        assert cli("convert", MOE, part, "--part", f"{i}/2", "--max-shard-size", "200KB", "--quiet").exit_code == 0
    data = json.loads(cli("assemble", tmp_path / "joined", *parts, "--json").stdout)
    assert (data["ok"], data["command"], data["parts"]) == (True, "assemble", 2)


@pytest.mark.parametrize(
    "args, error, exit_code, hint",
    [
        (["convert", MOE, "OUT", "--scheme", "w4a8-mxfp4"], "BadParameter", 2, "did you mean 'w4a8-mxfp'?"),
        (["convert", MOE, "OUT", "--scale-rule", "MSE"], "BadParameter", 2, "did you mean 'mse'?"),
        (["convert", MOE, "OUT", "--sceme", "w4a8-mxfp"], "NoSuchOption", 2, None),
        (["verify"], "MissingParameter", 2, None),
        (["convert", MOE, "OUT", "--override", "model.layers.1.*=float"], "BadOptionError", 2,
         f"did you mean --override 'model.layers.1.*=FLOAT'? (TYPE is one of {', '.join(QUANT_TYPES)})"),
        (["convert", MOE, "OUT", "--max-shard-size", "4g"], "BadOptionError", 2,
         "use a number with an optional unit: 500MB, 2GiB, 0"),
    ],
)
def test_usage_errors_print_the_error_envelope_with_json(tmp_path, args, error, exit_code, hint):
    args = [tmp_path / "out" if a == "OUT" else a for a in args]
    done = module_cli(*args, "--json", cwd=tmp_path)
    assert done.returncode == exit_code, done.stderr
    data = json.loads(done.stdout)
    assert data == {"ok": False, "schema": 1, "command": args[0], "error": error, "message": data["message"],
                    "hint": hint, "exit_code": exit_code}
    assert data["message"] and data["message"] in done.stderr  # the same words for a person
    if hint:
        assert f"hint: {hint}" in done.stderr
    plain = module_cli(*args, cwd=tmp_path)
    assert plain.returncode == exit_code and plain.stdout == ""  # without --json, nothing on stdout
    if error == "BadOptionError":
        assert args[-2] in data["message"]  # the option is named


def test_h_is_help_and_completion_is_offered():
    for args in (["-h"], ["convert", "-h"], ["verify", "-h"]):
        result = cli(*args)
        assert result.exit_code == 0 and "Usage: " in result.stdout and "-h, --help" in result.stdout
    assert "--install-completion" in cli("-h").stdout
    shown = cli("--show-completion", "bash", env={"SHELL": "/bin/bash"})
    assert shown.exit_code == 0 and "complete" in shown.stdout


# --- inputs that are not what the command takes ------------------------------------------------


def test_a_mistyped_local_path_is_not_called_a_cache_miss(tmp_path):
    (tmp_path / "models" / "qwen3-moe-fp8").mkdir(parents=True)
    done = module_cli("inspect", "models/qwen3-moe-fp9", "--json", cwd=tmp_path, env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub")})
    data = json.loads(done.stdout)
    assert (done.returncode, data["error"]) == (3, "NotFoundError") and "no such directory" in data["message"]
    assert data["hint"] == "did you mean models/qwen3-moe-fp8?"
    done = module_cli("inspect", "org/not-here", "--json", cwd=tmp_path, env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert json.loads(done.stdout)["error"] == "NotCachedError"  # no local directory "org": a repo id


def test_a_package_given_as_src_or_as_verify_source_and_a_part_directory_are_named(tmp_path):
    package = tmp_path / "pkg"
    convert(MOE, package, ConvertOptions())
    result = cli("convert", package, tmp_path / "again", "--json")
    data = json.loads(result.stdout)
    assert (result.exit_code, data["error"]) == (3, "PackageAsSourceError")
    assert "this is an AscendV1 package" in data["message"] and "inspect or verify it" in data["hint"]
    assert not (tmp_path / "again").exists()
    # as verify's --source too: not "holds F8_E4M3 tensors but config.json has no quantization_config"
    result = cli("verify", package, "--source", package, "--json")
    data = json.loads(result.stdout)
    assert (result.exit_code, data["error"]) == (3, "PackageAsSourceError")
    assert data["message"] == f"{package}: this is an AscendV1 package (it holds quant_model_description.json), not a source checkpoint"
    assert data["hint"] == "--source takes the checkpoint the package was converted from: `ascendconv verify PACKAGE --source CHECKPOINT`"

    part = tmp_path / "part2"
    convert(MOE, part, ConvertOptions(part=(2, 3), max_shard_size=200_000))
    for command in ("inspect", "verify"):
        result = cli(command, part, "--json")
        data = json.loads(result.stdout)
        assert (result.exit_code, data["error"]) == (3, "PartDirectoryError")
        assert f"{part}: part 2 of 3 of a `convert --part` run" in data["message"] and data["hint"].startswith("run assemble")
    # as SRC or --source: a part, not "an AscendV1 package" with the hint to inspect or verify it, which refuse it
    result = cli("convert", part, tmp_path / "again", "--json")
    assert json.loads(result.stdout) == {
        "ok": False, "schema": 1, "command": "convert", "error": "PackageAsSourceError", "exit_code": 3,
        "message": f"{part}: this is a part of an AscendV1 package (it holds ascendconv_part.json), not a source checkpoint",
        "hint": "pass the checkpoint it came from; `ascendconv assemble OUT PARTDIR...` joins the parts into the package",
    }
    assert result.exit_code == 3 and not (tmp_path / "again").exists()
    data = json.loads(cli("verify", package, "--source", part, "--json").stdout)
    assert data["message"] == f"{part}: this is a part of an AscendV1 package (it holds ascendconv_part.json), not a source checkpoint"
    assert data["hint"] == "--source takes the checkpoint the package was converted from: `ascendconv verify PACKAGE --source CHECKPOINT`"


# --- the package explains itself ---------------------------------------------------------------


def cached_copy(tmp_path: Path, source: Path, repo: str, commit: str) -> Path:
    """`source` as a snapshot of a Hugging Face cache under tmp_path/hub (files copied, not linked)."""
    repo_dir = tmp_path / "hub" / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    shutil.copytree(source, snapshot)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


def front_matter(card: str) -> list[str]:
    lines = card.splitlines()
    assert lines[0] == "---"
    return lines[1 : lines.index("---", 1)]


def test_the_package_card_and_provenance_say_what_it_is(tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    cached_copy(tmp_path, MOE, "Qwen/Qwen3-Tiny-FP8", commit)
    (tmp_path / "hub" / "models--Qwen--Qwen3-Tiny-FP8" / "snapshots" / commit / "README.md").write_text(
        "---\nlicense: apache-2.0\nlanguage:\n- en\ntags:\n- fp8\n---\n\n# Qwen3 Tiny FP8\n\nThe original | card.\n"
    )
    out = tmp_path / "out"
    result = cli("convert", "Qwen/Qwen3-Tiny-FP8@main", out, "--scheme", "w4a8-mxfp-moe", "--tp", "2", "--ep",
                 "--override", "model.layers.1.mlp.experts.0.*=W8A8_MXFP8", "--quiet", env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert result.exit_code == 0, result.output
    provenance = Provenance(json.loads((out / "ascendconv_provenance.json").read_text()))
    assert provenance.hub == {"repo_id": "Qwen/Qwen3-Tiny-FP8", "revision": commit}
    assert provenance.deployment == {"tp": 2, "ep": True, "shared_experts_as_routed": False, "mtp_heads": True}
    assert provenance.overrides == ["model.layers.1.mlp.experts.0.*=W8A8_MXFP8"]
    assert provenance.command == (
        f"ascendconv convert Qwen/Qwen3-Tiny-FP8@{commit} OUT --scheme w4a8-mxfp-moe --scale-rule mse --resolve-dtype bf16 "
        "--override 'model.layers.1.mlp.experts.0.*=W8A8_MXFP8' --tp 2 --ep"
    )
    assert provenance.date == "2025-12-01T21:30:00Z"  # SOURCE_DATE_EPOCH, as conftest pins it

    card = (out / "README.md").read_text()
    assert front_matter(card) == [
        "base_model: Qwen/Qwen3-Tiny-FP8", "base_model_relation: quantized", "license: apache-2.0", "language:", "- en",
        "library_name: vllm", "tags:", "- ascend", "- vllm-ascend", "- ascendconv", "- mx", "- quantized",
        "- w8a8-mxfp8", "- w4a8-mxfp",
    ]
    assert "vllm serve PACKAGE_DIR --quantization ascend --tensor-parallel-size 2 --enable-expert-parallel\n" in card
    assert f"ascendconv verify PACKAGE_DIR --source Qwen/Qwen3-Tiny-FP8@{commit}\n" in card
    assert f"\n{provenance.command}\n" in card
    assert "| `model.layers.*.mlp.experts.*.down_proj` | 8 | W4A8_MXFP 4, W8A8_MXFP8 4 |" in card
    # the override as given, not starred (Markdown text: its '*' and '_' escaped)
    assert "(--override model.layers.1.mlp.experts.0.\\*=W8A8\\_MXFP8)" in card
    assert card.endswith("# The source model's card\n\n# Qwen3 Tiny FP8\n\nThe original | card.\n")

    inspected = cli("inspect", out).stdout
    assert f"source            Qwen/Qwen3-Tiny-FP8 at revision {commit}, on 2025-12-01T21:30:00Z\n" in inspected
    assert "planned for       --tp 2 --ep\n" in inspected and f"command           {provenance.command}\n" in inspected
    verified = cli("verify", out)
    assert verified.exit_code == 0 and "checked for --tp 2 --ep, as recorded at conversion" in verified.stdout
    data = json.loads(cli("verify", out, "--json").stdout)
    assert (data["options"]["tp"], data["options"]["ep"]) == (2, True)
    data = json.loads(cli("verify", out, "--json", "--tp", "1", "--no-ep").stdout)
    assert (data["options"]["tp"], data["options"]["ep"]) == (1, False)


def test_without_source_date_epoch_only_the_date_differs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    for name in ("a", "b"):
        assert module_cli("convert", MOE, tmp_path / name, "--quiet", env=env).returncode == 0
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in files:
        a, b = (tmp_path / "a" / name).read_bytes(), (tmp_path / "b" / name).read_bytes()
        if name == "ascendconv_provenance.json":
            a, b = json.loads(a), json.loads(b)
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", a.pop("date")) and b.pop("date")
        assert a == b, name


def test_a_card_is_written_where_the_source_has_none(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(MOE, source)
    (source / "README.md").unlink()
    convert(source, tmp_path / "out", ConvertOptions())
    card = (tmp_path / "out" / "README.md").read_text()
    assert "base_model" not in card and card.startswith("---\nlibrary_name: vllm\n")
    assert "The source model's card" not in card and "# src, AscendV1 W8A8_MXFP8" in card


def test_the_recorded_command_leaves_out_what_does_not_shape_the_bytes():
    options = ConvertOptions(workers=3, resume=True, part=(1, 2), overwrite=True, kernel="reference", max_shard_size=10**6)
    assert convert_command("my ckpt", options) == (
        "ascendconv convert 'my ckpt' OUT --scheme w8a8-mxfp8 --scale-rule mse --resolve-dtype bf16 --max-shard-size 1000000"
    )


# --- pipes -------------------------------------------------------------------------------------


def test_in_a_pipe_no_line_is_wrapped_or_padded(tmp_path):
    package = tmp_path / "pkg"
    convert(MOE, package, ConvertOptions(scheme="w4a8-mxfp-moe"))
    for args in (["inspect", package], ["inspect", MOE], ["verify", package, "--source", MOE],
                 ["convert", MOE, tmp_path / "dry", "--dry-run"]):
        done = module_cli(*args, env={**os.environ, "COLUMNS": "80"})
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert [line for line in lines if line != line.rstrip()] == []
        assert any(len(line) > 80 for line in lines) or args[0] == "convert"
    verify_lines = module_cli("verify", package, "--source", MOE).stdout.splitlines()
    assert verify_lines[0].startswith(f"verify {package}  (ascendconv ") and verify_lines[0].endswith(")")  # one line


# --- the scripts a user runs -------------------------------------------------------------------

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_make_fixtures_help_creates_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPTS / "make_fixtures.py"), "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and "usage: make_fixtures.py [-h] [OUT_DIR]" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_the_synthetic_checkpoint_generator_writes_what_convert_takes(tmp_path):
    src = tmp_path / "synthetic"
    argv = [sys.executable, str(SCRIPTS / "synthetic_checkpoint.py"), str(src), "--layers", "3", "--hidden", "256",
            "--experts", "4", "--moe-intermediate", "128", "--dense-intermediate", "384", "--vocab", "64",
            "--q-lora-rank", "128", "--kv-lora-rank", "128", "--shard-mb", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "exists" in again.stderr  # never over an existing directory
    config = json.loads((src / "config.json").read_text())
    assert (config["num_hidden_layers"], config["n_routed_experts"], config["hidden_size"]) == (3, 4, 256)
    assert len(list(src.glob("model-*.safetensors"))) > 1 and not (tmp_path / "synthetic.partial").exists()
    result = convert(src, tmp_path / "out", ConvertOptions(scheme="w4a8-mxfp-moe"))
    groups = result.plan.module_groups()
    assert groups["model.layers.*.mlp.experts.*.down_proj"] == {"W4A8_MXFP": 8}  # 2 MoE layers x 4 experts
    assert groups["model.layers.*.self_attn.kv_b_proj"] == {"FLOAT": 3}  # DeepSeek's rules keep it FLOAT


# --- where reports go, unreadable input, a reader that leaves ------------------------------------


@pytest.fixture(scope="module")
def moe_package(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pkg") / "moe-w4"
    convert(MOE, out, ConvertOptions(scheme="w4a8-mxfp-moe"))
    return out


def no_verify_may_run(monkeypatch):
    import ascendconv.verify as verify_module

    def verify(*args, **kwargs):
        raise AssertionError("a check ran before the report's destination was refused")

    monkeypatch.setattr(verify_module, "verify", verify)


def test_a_report_inside_the_package_is_refused_before_any_check(moe_package, monkeypatch):
    card = (moe_package / "README.md").read_bytes()
    no_verify_may_run(monkeypatch)
    result = cli("verify", moe_package, "--report", moe_package / "README.md", "--json")
    envelope = json.loads(result.stdout)
    assert result.exit_code == 2 and envelope["error"] == "BadOptionError"
    assert "is inside the package it reports on" in envelope["message"] and "moe-w4.verify.md" in envelope["hint"]
    assert (moe_package / "README.md").read_bytes() == card


def test_a_report_or_step_summary_that_cannot_be_written_is_refused_before_any_check(moe_package, tmp_path, monkeypatch):
    no_verify_may_run(monkeypatch)
    result = cli("verify", moe_package, "--report", tmp_path / "nowhere" / "r.html", "--json")
    envelope = json.loads(result.stdout)
    assert result.exit_code == 2 and envelope["error"] == "OutputPathError"
    assert "cannot be written (No such file or directory)" in envelope["message"]
    assert envelope["hint"] == "choose a file in a directory you may write to"
    result = cli("verify", moe_package, "--step-summary", "--json", env={"GITHUB_STEP_SUMMARY": str(tmp_path)})
    assert result.exit_code == 2 and "is not a regular file" in json.loads(result.stdout)["message"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the probes left nothing


def test_a_report_that_fails_at_the_end_keeps_the_verdict(moe_package, tmp_path, monkeypatch):
    report = tmp_path / "r.md"
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self == report:
            raise OSError(28, "No space left on device", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    result = cli("verify", moe_package, "--report", report, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["ok"] is True
    assert f"--report {report}: cannot write (No space left on device); that report was not written" in result.stderr


@pytest.mark.parametrize("command", ["inspect", "convert", "verify", "verify --source", "assemble"])
def test_an_unreadable_directory_is_a_named_input_error(moe_package, tmp_path, command):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o000)
    args = {
        "inspect": ["inspect", locked],
        "convert": ["convert", locked, tmp_path / "out"],
        "verify": ["verify", locked],
        "verify --source": ["verify", moe_package, "--source", locked],
        "assemble": ["assemble", tmp_path / "out", locked],
    }[command]
    # root reads any directory: drop the capabilities that let it, for the one process
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []
    if prefix and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no directory is unreadable")
    done = subprocess.run([*prefix, sys.executable, "-m", "ascendconv", *map(str, args), "--json"],
                          capture_output=True, text=True, timeout=300)
    locked.chmod(0o755)
    envelope = json.loads(done.stdout)
    assert done.returncode == 3, done.stderr
    assert envelope["error"] in ("UnreadableInputError", "PartError"), envelope
    assert str(locked) in envelope["message"] and "Traceback" not in done.stderr


def test_an_unreadable_input_met_anywhere_is_named_with_its_path(monkeypatch):
    import ascendconv.inspect as inspect_module

    def inspect_path(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "ckpt/config.json")

    monkeypatch.setattr(inspect_module, "inspect_path", inspect_path)
    result = cli("inspect", MOE, "--json")
    envelope = json.loads(result.stdout)
    assert result.exit_code == 3 and envelope["error"] == "UnreadableInputError"
    assert envelope["message"] == "ckpt/config.json: cannot be read (Permission denied)"


@pytest.mark.parametrize("args", [["inspect", MOE], ["inspect", MOE, "--json"], ["verify", "PACKAGE"]])
def test_a_reader_that_leaves_ends_the_command_with_141_never_1(moe_package, args):
    args = [moe_package if a == "PACKAGE" else a for a in args]
    process = subprocess.Popen([sys.executable, "-m", "ascendconv", *map(str, args)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    process.stdout.close()  # as `| head -0` does
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 141 and "Traceback" not in stderr and "Exception ignored" not in stderr
