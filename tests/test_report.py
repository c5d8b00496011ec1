"""verify's reports: --report FILE.html (checked in a real headless Chromium where one is installed),
--report FILE.md and --step-summary, and the per-layer strip of the terminal, all drawn from
VerifyReport.to_dict(); names from files are escaped in every format."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.cli.render import report_html, report_md
from ascendconv.convert import ConvertOptions, convert
from ascendconv.verify import VerifyOptions, verify
from conftest import FIXTURES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from report_screenshot import browser, headless  # noqa: E402

runner = CliRunner()
MOE = FIXTURES / "qwen3-moe-fp8"
HOSTILE = 'model.layers.3.mlp.experts.7.<script>alert("x")</script>|`a`&b.weight'


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, dict]:
    """A converted MoE package and its verify --source --moe-check report, as JSON data."""
    out = tmp_path_factory.mktemp("report") / "pkg"
    convert(MOE, out, ConvertOptions(scheme="w4a8-mxfp-moe", overrides=[]))
    report = verify(out, VerifyOptions(source=MOE, moe_check=True))
    assert report.ok
    return out, json.loads(json.dumps(report.to_dict()))


def html_of(data: dict) -> str:
    text = io.StringIO()
    report_html.render(data, text)
    return text.getvalue()


def md_of(data: dict) -> str:
    text = io.StringIO()
    report_md.render(data, text)
    return text.getvalue()


def layer_kind_pairs(data: dict) -> set[tuple[str, str]]:
    """(layer number, module kind with numbers as *) of each measured weight, by this test's own parse."""
    pairs = set()
    for t in data["tensors"]:
        match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", t["name"])
        pairs.add((match[1], re.sub(r"\.\d+\.", ".*.", match[2])))
    return pairs


def with_hostile_name(data: dict) -> dict:
    data = json.loads(json.dumps(data))
    data["tensors"][0]["name"] = HOSTILE
    data["checks"][0]["detail"] = "<b>bold</b> & [link](http://x) *star*"
    data["checks"][0]["problems"] = ["<img src=x onerror=alert(1)>"]
    data["checks"][0]["ok"] = False  # its problems are listed
    data["provenance"]["command"] = "ascendconv convert `rm -rf` OUT"
    return data


def test_html_report_holds_every_part_and_escapes_names(measured):
    _, data = measured
    page = html_of(data)
    assert page.startswith("<!DOCTYPE html>") and "default-src 'none'" in page
    assert not re.search(r"<(script|link|img|iframe)\b", page) and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    cells = re.findall(r'<g class="cell" data-layer="([^"]*)" data-kind="([^"]*)">', page)
    assert sorted(cells) == sorted(layer_kind_pairs(data))
    for title in ("SQNR per layer and module kind", "Error distribution per quant type", "MoE layers", "Fallbacks (0)",
                  "Checks", "Provenance", f"Worst 20 of {len(data['tensors'])} weights"):
        assert title in page, title
    for check in data["checks"]:
        assert f"<code>{check['name']}</code>" in page

    hostile = html_of(with_hostile_name(data))
    assert "<script>" not in hostile and "<img src=x" not in hostile and "<b>bold</b>" not in hostile
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;|`a`&amp;b" in hostile


def test_markdown_report_is_small_and_escapes_names(measured):
    _, data = measured
    text = md_of(data)
    assert text.startswith(f"## ascendconv verify `{data['package']}`\n\n**✅ OK: ")
    assert "| `mlp.experts.*.down_proj` |" in text and "### MoE layers" in text and "### Provenance" in text
    rows = [line for line in text.splitlines() if re.match(r"\| (\d+) \|", line)]
    assert [line.split(" | ")[0][2:] for line in rows] == sorted({p[0] for p in layer_kind_pairs(data)}, key=int)
    hostile = md_of(with_hostile_name(data))
    # prose from a file is escaped; names and problems are code spans (where Markdown shows HTML as text)
    # (the backslash before ':' keeps GFM from making the URL a link: test_untrusted_text.py)
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; \\[link\\](http\\://x) \\*star\\*" in hostile and "<b>" not in hostile
    assert "| ``" + HOSTILE.replace("|", "\\|") + "`` |" in hostile  # a longer fence around its backticks
    assert "- `<img src=x onerror=alert(1)>`" in hostile
    assert "| ``ascendconv convert `rm -rf` OUT`` |" in hostile
    outside_code = re.sub(r"(`+).*?\1", "", hostile)
    assert "<" not in outside_code and "](" not in outside_code.replace("\\](", "")
    worst_rows = [line for line in hostile.splitlines() if line.startswith("| `") and ".weight`" in line]
    assert len(worst_rows) == 10
    columns = {line.replace("\\|", "").count("|") for line in worst_rows}
    assert len(columns) == 1  # no row of the worst-weights table gained a column from a '|' in a name


def test_a_provenance_setting_missing_or_of_another_type_is_shown_as_json_never_as_none(measured):
    _, data = measured
    provenance = {**data["provenance"], "version": None, "kernel": 3, "scheme": ["w4a8-mxfp-moe"], "source": None, "hub": None}
    damaged = {**data, "provenance": provenance}
    for text in (md_of(damaged), html_of(damaged)):
        assert "None" not in text.split("Provenance")[-1]
    text = md_of(damaged)
    assert "| written by | ascendconv null, kernel 3 |" in text and "| source | null |" in text
    assert '| scheme | \\["w4a8-mxfp-moe"\\], rule mse, resolve bf16 |' in text


def test_markdown_of_a_deepseek_sized_report_stays_small():
    """61 layers x 256 experts x 3 projections: tables of groups, not of tensors, under the 1 MiB that a
    GitHub job summary may hold, and the HTML page too stays well below the report's JSON."""
    tensors = [
        {"name": f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight", "type": "W4A8_MXFP", "rel_err": 0.11,
         "sqnr_db": 19.0 - 0.001 * e, "max_abs": 0.02, "saturated": 0.03, "min_sqnr_db": 15.0, "ok": True}
        for layer in range(3, 61) for e in range(256) for proj in ("gate_proj", "up_proj", "down_proj")
    ]
    data = {"ok": True, "package": "out", "failed": [], "checks": [], "tensors": tensors, "moe": [], "npu": [],
            "provenance": None, "options": {}, "seconds": 1.0}
    text = md_of(data)
    assert len(text.encode()) < 20_000
    assert [int(m) for m in re.findall(r"^\| (\d+) \|", text, re.M)] == list(range(3, 61))  # one row per layer
    page = html_of(data)
    assert len(page.encode()) < 200_000 and page.count('<g class="cell"') == 58 * 3


def test_cli_writes_reports_and_appends_the_step_summary(measured, tmp_path):
    package, data = measured
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    result = runner.invoke(app, ["verify", str(package), "--source", str(MOE), "--moe-check", "--report",
                                 str(tmp_path / "r.html"), "--step-summary"], env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.exit_code == 0, result.output
    assert re.findall(r'<g class="cell"', (tmp_path / "r.html").read_text()).__len__() == len(layer_kind_pairs(data))
    appended = summary.read_text()
    assert appended.startswith("earlier step\n## ascendconv verify ") and "### SQNR per quant type (dB)" in appended
    result = runner.invoke(app, ["verify", str(package), "--report", str(tmp_path / "r.md"), "--step-summary"],
                           env={"GITHUB_STEP_SUMMARY": ""})
    assert result.exit_code == 0 and "$GITHUB_STEP_SUMMARY is not set" in result.stderr
    assert (tmp_path / "r.md").read_text().startswith("## ascendconv verify ")
    result = runner.invoke(app, ["verify", str(package), "--report", str(tmp_path / "r.pdf"), "--json"])
    assert result.exit_code == 2 and json.loads(result.stdout)["error"] == "BadOptionError"


def test_report_given_twice_writes_both_files_and_one_file_twice_is_refused(measured, tmp_path):
    package, data = measured
    result = runner.invoke(app, ["verify", str(package), "--report", str(tmp_path / "r.html"), "--report", str(tmp_path / "r.md")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and '<span class="verdict ok">' in page
    assert (tmp_path / "r.md").read_text().startswith("## ascendconv verify ")
    (tmp_path / "sub").mkdir()
    for second, words in ((str(tmp_path / "r.md"), "is given twice"), (f"{tmp_path}/sub/../r.md", f"names the same file as --report {tmp_path / 'r.md'}")):
        (tmp_path / "r.md").unlink(missing_ok=True)
        result = runner.invoke(app, ["verify", str(package), "--report", str(tmp_path / "r.md"), "--report", second, "--json"])
        assert result.exit_code == 2
        error = json.loads(result.stdout)
        assert (error["error"], error["message"], error["hint"]) == (
            "BadOptionError", f"--report {Path(second)}: {words}", "give each report file once")
        assert not (tmp_path / "r.md").exists()  # refused before any check ran


def test_a_failed_verify_still_writes_its_report(measured, tmp_path):
    package, _ = measured
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in package.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "config.json").write_text(json.dumps({**json.loads((package / "config.json").read_text()),
                                                    "quantization_config": {"quant_method": "fp8"}}))
    result = runner.invoke(app, ["verify", str(broken), "--report", str(tmp_path / "r.html")])
    assert result.exit_code == 1
    page = (tmp_path / "r.html").read_text()
    assert '<span class="verdict fail">FAILED: 2 checks failed: config, copies</span>' in page


def test_terminal_strip_has_a_mark_per_layer_per_kind(measured):
    package, data = measured
    lines = runner.invoke(app, ["verify", str(package), "--source", str(MOE)], env={"COLUMNS": "80"}).stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("worst SQNR per layer, 0 to 1 left to right"))
    kinds = sorted({kind for _, kind in layer_kind_pairs(data)})
    strip = lines[start + 1 : start + 1 + len(kinds)]
    assert [line.split()[0] for line in strip] == kinds
    for line, kind in zip(strip, kinds):
        marks = line[max(len(k) for k in kinds) + 2 :].split("  ")[0]
        layers = {layer for layer, k in layer_kind_pairs(data) if k == kind}
        assert [m != " " for m in marks] == [str(n) in layers for n in range(2)], line
        assert set(marks) <= set("▁▂▃▄▅▆▇█ =!")


def test_terminal_strip_says_in_words_what_is_outside_the_layers(tmp_path):
    """A kind in no layer (here layer 1's MLP moved to a vision merger) had a line of blank marks
    and no figure; a kind also outside the layers left those weights out of its line."""
    from rich.console import Console

    from ascendconv.cli.render.verify import layer_strip
    from test_source_formats import respell

    src = respell(FIXTURES / "qwen3-dense-fp8", tmp_path / "src",
                  lambda name, entry: {name.replace("model.layers.1.mlp.", "model.visual.merger."): entry}, lambda c: c)
    convert(src, tmp_path / "out", ConvertOptions())
    lines = runner.invoke(app, ["verify", str(tmp_path / "out"), "--source", str(src)], env={"COLUMNS": "120"}).stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("worst SQNR per layer, 0 to 1 left to right"))
    merger = [line for line in lines[start + 1 : start + 11] if line.startswith("model.visual.merger.")]
    assert [re.sub(r"\d+\.\d dB", "N dB", line) for line in merger] == [
        f"{'model.visual.merger.' + proj:<29}  outside the layers: N dB" for proj in ("down_proj", "gate_proj", "up_proj")]
    assert next(line for line in lines[start + 1 :] if line.startswith("mlp.down_proj ")).endswith(" dB (layer 0)")

    tensor = {"type": "W8A8_MXFP8", "rel_err": 0.1, "max_abs": 0.1, "saturated": 0.0, "min_sqnr_db": 20.0}
    data = {"tensors": [
        {**tensor, "name": "model.layers.0.mlp.down_proj.weight", "sqnr_db": 30.0, "ok": True},
        {**tensor, "name": "mlp.down_proj.weight", "sqnr_db": 8.0, "ok": False},  # the kind also outside the layers
        {**tensor, "name": "mtp.0.attn.wq_b.weight", "sqnr_db": None, "ok": True, "type": "FLOAT"},
    ]}
    console = Console(file=io.StringIO(), width=120)
    layer_strip(data, console)
    assert console.file.getvalue().splitlines()[2:] == [
        "mlp.down_proj    ▆  30.0 dB (layer 0); outside the layers: 8.0 dB, 1 of 1 failed",
        "mtp.*.attn.wq_b  outside the layers: exact",
    ]


# --- a real browser ----------------------------------------------------------------------------

CHROMIUM = browser()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on this machine (Debian: apt-get install chromium); the page is checked as text only"
)


def load(page: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """The DOM a headless Chromium built from the page, and the console messages it logged."""
    done = subprocess.run(headless(CHROMIUM, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


@needs_chromium
def test_the_page_loads_in_chromium_without_console_messages(measured, tmp_path):
    # the probe first: a page that logs an error and fetches from the network must be caught
    probe = tmp_path / "probe.html"
    probe.write_text('<!DOCTYPE html><meta http-equiv="Content-Security-Policy" content="default-src \'none\'">'
                     '<img src="https://example.com/x.png"><p>probe</p>')
    _, messages = load(probe, tmp_path)
    assert any("Content Security Policy" in m for m in messages), messages

    _, data = measured
    page = tmp_path / "report.html"
    page.write_text(html_of(data))
    dom, messages = load(page, tmp_path)
    assert messages == []
    cells = re.findall(r'<g class="cell" data-layer="([^"]*)" data-kind="([^"]*)">', dom)
    assert sorted(cells) == sorted(layer_kind_pairs(data))  # one cell per measured layer and module kind

    page.write_text(html_of(with_hostile_name(data)))
    dom, messages = load(page, tmp_path)
    assert messages == [] and "<script" not in dom and "<img" not in dom  # the hostile names stayed text
    assert dom.count('<g class="cell"') == len(layer_kind_pairs(with_hostile_name(data)))


@needs_chromium
def test_the_screenshot_script_writes_a_small_png(tmp_path):
    png = tmp_path / "shot.png"
    done = subprocess.run([sys.executable, str(Path(__file__).resolve().parent.parent / "scripts" / "report_screenshot.py"),
                           str(png), "--width", "800", "--height", "600"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    head = png.read_bytes()
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(head[16:20], "big") == 800 and 10_000 < len(head) < 400_000
