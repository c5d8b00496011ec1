"""The human output of every command, as a pipe or a CI log receives it (not a terminal): real
content checked against the library's own results, tensor and module names whole."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.formats.constants import ResolveDtype, ScaleRule
from ascendconv.inspect import inspect_path
from ascendconv.options import KernelName
from ascendconv.decide import Scheme
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURES

runner = CliRunner()
DENSE, DEEPSEEK = FIXTURES / "qwen3-dense-fp8", FIXTURES / "deepseek-v3-fp8"


def ok(*args, columns: int = 60) -> list[str]:
    """A command's stdout lines; COLUMNS is what a pipe's reader's terminal would claim."""
    result = runner.invoke(app, [*map(str, args)], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def last_paragraph(lines: list[str]) -> str:
    """The closing summary (the last paragraph less its next steps)."""
    blank = max(i for i, line in enumerate(lines) if not line.strip())
    return " ".join(line.strip() for line in lines[blank + 1 :] if not line.startswith(("next: ", "then: ")))


def table_rows(lines: list[str], title: str, continued: bool = False) -> list[list[str]]:
    """The rows of the table printed under `title`, split on runs of two or more spaces; a cell's
    second line (an indented line) is a row of its own only when `continued`."""
    start = lines.index(title) + 3  # the title, the header, its rule
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        if continued or not line.startswith(" "):
            rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def test_convert_dry_run_shows_whole_modules_fallbacks_shards_and_totals(tmp_path):
    lines = ok("convert", DENSE, tmp_path / "out", "--dry-run", "--scheme", "w4a8-mxfp", "--kernel", "reference")
    plan = convert(DENSE, tmp_path / "lib", ConvertOptions(scheme="w4a8-mxfp"), dry_run=True).plan
    assert lines[0] == "plan (dry run, nothing written)"
    modules = table_rows(lines, "source linears, by module (layer and expert numbers as *)")
    assert [row[0] for row in modules] == list(plan.module_groups())
    assert any(len(line) > 60 for line in lines)  # nothing was cut to the 60 columns COLUMNS claims
    assert len(plan.fallbacks) == 1  # model.layers.1.mlp.down_proj: K=160 is no multiple of 64
    fallback = plan.fallbacks[0]
    rows = table_rows(lines, "1 fallback", continued=True)
    assert rows[0] == [fallback.module, "1", fallback.requested, fallback.reason]
    assert rows[1] == [f"→ {fallback.written}"]
    shards = table_rows(lines, "shards (limit 4.00 GiB)")
    assert [(row[0], int(row[1])) for row in shards] == [(s.file, len(s.tensors)) for s in plan.shards]
    assert last_paragraph(lines).startswith(f"w4a8-mxfp, rule mse, resolve bf16, kernel reference: {len(plan.tensors)} tensors (")


def test_convert_then_verify_then_inspect_of_the_package(tmp_path):
    out = tmp_path / "pkg"
    lines = ok("convert", DEEPSEEK, out, "--kernel", "reference", "--scheme", "w4a8-mxfp-moe", columns=400)
    assert lines[0] == f"wrote {out}"
    assert not any(line.startswith("shards (") for line in lines)  # a written package lists no plan shards
    totals = last_paragraph(lines)
    assert totals.startswith("w4a8-mxfp-moe, rule mse, resolve bf16, kernel reference: ") and totals.endswith(" s")
    result = convert(DEEPSEEK, tmp_path / "dry", ConvertOptions(scheme="w4a8-mxfp-moe"), dry_run=True)
    assert f" out ({(sum(p.stat().st_size for p in out.glob('quant_model_weights-*')) - result.plan.bytes_in) / result.plan.bytes_in:+.0%}) in " in totals
    assert lines[-2:] == [
        f"next: ascendconv verify {out} --source {DEEPSEEK}",
        f"then: vllm serve {out} --quantization ascend --tensor-parallel-size 1",
    ]

    report = verify(out, VerifyOptions())
    lines = ok("verify", out)
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["check", "result", "detail"])
    shown = {line.split()[0]: line.split()[1] for line in lines[start + 2 :] if line[:1].strip()}
    for check in report.checks:
        assert shown[check.name] == ("skip" if check.skipped else "pass")
    assert lines[-1].startswith(f"OK: {report.tally()} (") and report.tally() == f"{len(report.checks)} passed"

    listed = inspect_path(out, tensors="*").tensors
    lines = ok("inspect", out, "--tensors")
    names = [line.split()[0] for line in lines[4 : 4 + len(listed)]]
    assert names == [t.name for t in listed]
    assert any(len(name) > 40 for name in names)  # long expert names, whole


def test_inspect_of_a_source_lists_whole_module_groups(tmp_path):
    report = inspect_path(DEEPSEEK)
    lines = ok("inspect", DEEPSEEK)
    rows = table_rows(lines, "module groups (layer and expert numbers as *)")
    assert rows[len(report.groups)] == ["no fallbacks under any scheme"]
    rows = rows[: len(report.groups)]
    assert [(row[0], int(row[1])) for row in rows] == [(g.pattern, g.modules) for g in report.groups]
    assert any("…" not in row[0] and len(row[0]) > 40 for row in rows)


def test_assemble_reports_its_parts_and_shards(tmp_path):
    parts = [tmp_path / f"part{i}" for i in (1, 2)]
    for i, part in enumerate(parts, 1):
        ok("convert", DENSE, part, "--part", f"{i}/2", "--max-shard-size", "100KB", "--kernel", "reference", "-q")
    out = tmp_path / "pkg"
    lines = ok("assemble", out, *parts, columns=400)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) >= 2
    assert re.fullmatch(rf"wrote {re.escape(str(out))}: {len(shards)} shards from 2 parts \(\d+ linked, \d+ copied\), .* s", lines[0])


def test_help_lists_every_choice_and_a_typo_is_a_usage_error(tmp_path):
    help_text = runner.invoke(app, ["convert", "--help"], env={"COLUMNS": "200"}).stdout
    for choices in (Scheme, ScaleRule, ResolveDtype, KernelName):
        assert "|".join(c.value for c in choices) in help_text
    assert "[default: w8a8-mxfp8]" in help_text and "[default: 4GiB]" in help_text
    result = runner.invoke(app, ["convert", str(DENSE), str(tmp_path / "out"), "--scheme", "w8a8-mxf8"])
    assert result.exit_code == 2 and "w8a8-mxf8" in result.output and not (tmp_path / "out").exists()


def test_verify_help_names_every_exit_code_it_can_give():
    """verify exits 4 (EnvironmentProblem: --on-npu without an NPU) as docs/verify.md says; its
    --help listed 0 to 3 only."""
    from ascendconv.errors import EXIT_CHECK_FAILED, EXIT_ENVIRONMENT, EXIT_INPUT, EXIT_OK, EXIT_USAGE

    help_text = " ".join(runner.invoke(app, ["verify", "--help"], env={"COLUMNS": "200"}).stdout.split())
    for code in (EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_INPUT, EXIT_ENVIRONMENT):
        assert f"{code}: " in help_text, code


def test_ray_option_defaults_are_ray_options_defaults():
    """--ray-parts, --ray-cpus and --ray-retries show what RayOptions() holds, and pass nothing when
    not given (None: RayOptions keeps its own)."""
    import typer.main

    from ascendconv.options import RayOptions

    defaults = {p.name: p.default for p in typer.main.get_command(app).commands["convert"].params}
    assert (defaults["ray_parts"], defaults["ray_cpus"], defaults["ray_retries"]) == (None, None, None)
    help_text = " ".join(runner.invoke(app, ["convert", "--help"], env={"COLUMNS": "200"}).stdout.split())
    expected = RayOptions()
    for flag, value in (("--ray-parts", expected.parts), ("--ray-cpus", expected.cpus_per_task),
                        ("--ray-retries", expected.max_retries)):
        assert re.search(rf"{flag} <int> [^\[]*\[default: (\d+)\]", help_text)[1] == str(value), flag


@pytest.mark.parametrize("option", ["--scale-rule", "--resolve-dtype", "--kernel"])
def test_every_choice_option_refuses_a_typo(tmp_path, option):
    result = runner.invoke(app, ["convert", str(DENSE), str(tmp_path / "out"), option, "nope", "--dry-run"])
    assert result.exit_code == 2


def test_inspect_filter_heading_keeps_a_long_glob_whole_in_a_pipe(converted):
    glob = "model.layers.1.mlp.experts.0.down_proj.weight"
    lines = ok("inspect", converted("qwen3-moe-fp8"), "--filter", glob, columns=60)
    assert lines[1] == f"1 of 76 tensors match {glob!r}"
