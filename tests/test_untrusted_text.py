"""Text from an untrusted source checkpoint (tensor names, directory names, config values, its model
card) in what others render or parse: the package's model card (Markdown with YAML front matter),
verify's reports and the terminal. Each test parses the document and finds the hostile text as one
literal text node, code span or value."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from ascendconv.convert import ConvertOptions, convert
from ascendconv.decide import Override, module_pattern
from conftest import FIXTURES
from test_source_formats import respell

# a module name that tries to leave a code span, a table cell and a code block, and to be HTML or a link
HOSTILE = "q_proj`<img src=x onerror=alert(1)>`|[link](http://e.vil)\n```\n<script>alert(1)</script>"
# a source directory name that tries the same from the card's title, its first line and its code blocks
HOSTILE_DIR = "src`<img src=y>`\n```\n# not a heading [link](javascript:alert(1))"


def markdown_tokens(card: str):
    return MarkdownIt("commonmark").enable("table").parse(card)


def own_part(card: str) -> str:
    """The card ascendconv writes, without the source's card below it (the model's own text)."""
    return card.split("\n# The source model's card\n", 1)[0]


@pytest.fixture(scope="module")
def hostile_package(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hostile")

    def tensor(name, entry):
        return {name.replace("layers.1.self_attn.q_proj.", f"layers.1.self_attn.{HOSTILE}."): entry}

    source = respell(FIXTURES / "qwen3-dense-fp8", root / HOSTILE_DIR, tensor, lambda c: c)
    out = root / "out"
    convert(source, out, ConvertOptions())
    return source, out


def test_the_model_card_shows_hostile_names_as_literal_code(hostile_package):
    _, out = hostile_package
    card = own_part((out / "README.md").read_text())
    tokens = markdown_tokens(card)
    kinds = {t.type for t in tokens} | {c.type for t in tokens for c in t.children or []}
    assert not kinds & {"html_block", "html_inline", "link_open", "image"}, kinds
    pattern = module_pattern(f"model.layers.1.self_attn.{HOSTILE}")
    flat = " ".join(pattern.split())  # a code span is one line: its line breaks as spaces
    cells = [t for t in tokens if t.type == "inline" and any(c.content == flat for c in t.children)]
    assert len(cells) == 1 and [c.type for c in cells[0].children] == ["code_inline"], cells
    # the title and the first line name the source directory as text and as code, whole
    title = next(tokens[i + 1] for i, t in enumerate(tokens) if t.type == "heading_open")
    assert {c.type for c in title.children} == {"text"}
    assert "".join(c.content for c in title.children) == " ".join(HOSTILE_DIR.split()) + ", AscendV1 W8A8_MXFP8"
    first = next(t for t in tokens if t.type == "inline" and t.content.startswith("An AscendV1 MX package of"))
    assert [(c.type, c.content) for c in first.children[:2]] == [
        ("text", "An AscendV1 MX package of "), ("code_inline", " ".join(HOSTILE_DIR.split())), ]
    # the code blocks hold the directory's name (the commands quote it), every line of it inside them
    blocks = [t for t in tokens if t.type == "fence"]
    assert [b.content.splitlines()[0] for b in blocks] == [
        "vllm serve PACKAGE_DIR --quantization ascend --tensor-parallel-size 1",
        "ascendconv verify PACKAGE_DIR --source 'src`<img src=y>`",
        "ascendconv convert 'src`<img src=y>`",
    ]
    assert all(b.content.endswith("# not a heading [link](javascript:alert(1))'\n") or "OUT --scheme" in b.content for b in blocks[1:])
    assert not [t for t in tokens if t.type == "heading_open" and t.tag == "h1"][1:]  # one title: no heading smuggled in


# A module name and a directory name (which holds no '/') that GFM's autolinks (extension) would make
# links of though every markup character in them is escaped: 'www.' after a space or '(', a scheme
# with '://', an email address
LINKS = "x (www.evil.example) http://evil.example/p a@evil.example y"
LINKS_DIR = "www.evil.example (b@evil.example) http:x"
EMAIL = re.compile(r"[A-Za-z0-9.+_-]+@[A-Za-z0-9._-]+")


@pytest.fixture(scope="module")
def linked_package(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("links")

    def tensor(name, entry):
        return {name.replace("layers.1.self_attn.", f"layers.1.self_attn.{LINKS}."): entry}

    source = respell(FIXTURES / "qwen3-dense-fp8", root / LINKS_DIR, tensor, lambda c: c)
    # k_proj and v_proj fall back to FLOAT with q_proj: their reason, prose, names the q_proj
    convert(source, root / "out", ConvertOptions(overrides=[Override("*q_proj", "FLOAT")]))
    return root / "out"


def assert_no_autolink(document: str) -> None:
    """No inline of `document` holds what GFM links. The venv has no GFM renderer (markdown-it-py
    links only with linkify-it-py), so this reads the source as GFM's autolinks extension does
    (cmark-gfm's extensions/autolink.c): a 'www.' and an 'http://' ('https://', 'ftp://') it matches
    in the line as written, outside code spans, where '\\.' and '\\:' (rendered '.' and ':') break
    them; an email address it matches in the text after the escapes are resolved, so that may hold
    none."""
    inlines = [t for t in markdown_tokens(document) if t.type == "inline"]
    assert inlines
    for inline in inlines:
        written = re.sub(r"(`+).*?\1", "", inline.content)  # the source, its code spans left out
        written = re.sub(r"\\[!-/:-@[-`{-~]", "\x00", written)  # an escape is not the character it shows
        assert "www." not in written.lower() and "://" not in written, inline.content
        assert not [c.content for c in inline.children if c.type == "text" and EMAIL.search(c.content)], inline.content


def shown(inline) -> str:
    return "".join(c.content for c in inline.children)


def test_no_name_in_the_model_card_or_the_markdown_report_is_a_link(linked_package, tmp_path):
    from typer.testing import CliRunner

    from ascendconv.cli import app

    card = own_part((linked_package / "README.md").read_text())
    assert_no_autolink(card)
    lines = card.splitlines()
    assert "# www\\.evil.example (`b@evil.example`) http:x, AscendV1 W8A8_MXFP8" in lines
    reason = ("packed with model.layers.\\*.self\\_attn.x (www\\.evil.example) http\\://evil.example/p `a@evil.example` "
              "y.q\\_proj was requested as FLOAT (--override \\*q\\_proj=FLOAT)")
    assert len([line for line in lines if line.endswith(f" | W8A8_MXFP8 | FLOAT | {reason} |")]) == 2  # k_proj, v_proj
    # rendered, each shows as it was written: the escapes are dropped, an address is code
    tokens = markdown_tokens(card)
    title = next(tokens[i + 1] for i, t in enumerate(tokens) if t.type == "heading_open")
    assert shown(title) == f"{LINKS_DIR}, AscendV1 W8A8_MXFP8"
    cells = [t for t in tokens if t.type == "inline" and t.content == reason]
    assert len(cells) == 2 and shown(cells[0]) == (
        f"packed with model.layers.*.self_attn.{LINKS}.q_proj was requested as FLOAT (--override *q_proj=FLOAT)")
    # verify's Markdown report shows the source's name so too; its HTML report is HTML-escaped text,
    # which no browser makes a link of, and holds no link of its own
    result = CliRunner().invoke(app, ["verify", str(linked_package), "--report", str(tmp_path / "r.md"),
                                      "--report", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "r.md").read_text()
    assert_no_autolink(report)
    assert "| source | www\\.evil.example (`b@evil.example`) http:x |" in report.splitlines()
    page = (tmp_path / "r.html").read_text()
    assert f"{LINKS_DIR}</td>" in page and not re.search(r"<a\b|href=", page)


def front_matter(card: str) -> dict:
    import yaml  # PyYAML, with ray among the test dependencies: the Hub reads front matter as YAML

    assert card.startswith("---\n")
    return yaml.safe_load(card[4:card.index("\n---\n", 4)])


@pytest.mark.parametrize("repo_dir", ["models--org--x\nlicense: evil", "models--org--x: y", "models--org--x #y", "models--órg--x"])
def test_a_cache_directory_whose_name_is_no_repo_id_gives_no_base_model(tmp_path, repo_dir):
    from ascendconv.io.hfcache import cached_repo

    snapshot = tmp_path / "hub" / repo_dir / "snapshots" / ("0123456789abcdef" * 2 + "01234567")
    snapshot.parent.mkdir(parents=True)
    shutil.copytree(FIXTURES / "qwen3-dense-fp8", snapshot)
    assert cached_repo(snapshot) is None
    assert cached_repo(snapshot.parent / "abc\n") is None  # nor a revision that is no name of the Hub's
    convert(snapshot, tmp_path / "out", ConvertOptions())
    meta = front_matter((tmp_path / "out" / "README.md").read_text())
    assert set(meta) == {"library_name", "tags"}  # the source's card has no front matter to carry
    assert json.loads((tmp_path / "out" / "ascendconv_provenance.json").read_text())["hub"] is None


# A source card's front matter of forms YAML readers take differently, or that would end our front
# matter's parse if copied as lines: each carried key is written again as a value, or left out.
HOSTILE_FRONT = """---
license: "mit
base_model: evil/model"
license_name: 'Llama ''3'' licence' # a comment
license_link: https://example.com/LICENSE?a=1#frag
language: [en, 'fr']
pipeline_tag: text-generation
	base_model: tabbed
license: apache-2.0
language_extra: x
---

# The card
"""


def test_carried_front_matter_is_written_again_never_copied(tmp_path):
    from ascendconv.package_files import _front_matter

    source = tmp_path / "src"
    shutil.copytree(FIXTURES / "qwen3-dense-fp8", source)
    (source / "README.md").write_text(HOSTILE_FRONT)
    convert(source, tmp_path / "out", ConvertOptions())
    card = (tmp_path / "out" / "README.md").read_text()
    assert front_matter(card) == {
        "license": "apache-2.0", "license_name": "Llama '3' licence", "license_link": "https://example.com/LICENSE?a=1#frag",
        "language": ["en", "fr"], "library_name": "vllm",
        "tags": ["ascend", "vllm-ascend", "ascendconv", "mx", "quantized", "w8a8-mxfp8"],
    }  # pipeline_tag left out: a tabbed line under it is no form of ours
    assert card.count("\n---\n") == 2 and card.endswith("# The source model's card\n\n# The card\n")
    # every form a key can take that is not carried; each alone, the key is left out whole
    for value in ('"open', "'a' b'", "&anchor mit", "!!str mit", "|\n  mit", "mit\n  more", "[a, [b]]", "a: b",
                  "\n- ok\n- - nested", "\n- ok\n  bad: x", "\"\\x41\""):
        assert _front_matter(f"---\nlicense: {value}\n---\n")[0] == [], value
    # a value is written as one line, quoted where its characters need it, never a line break of its own
    assert _front_matter('---\nlicense_name: "a\\u2028b\\nc\\"\\\\ d\\u00e9"\n---\n')[0] == [
        'license_name: "a\\u2028b\\u000ac\\"\\\\ dé"']
    assert _front_matter("---\nlicense: apache-2.0\nlanguage:\n- en\n-   'no'\n---\n")[0] == [
        "license: apache-2.0", "language:", "- en", '- "no"']


# --- the terminal --------------------------------------------------------------------------------

# ESC sequences (a colour, an OSC 8 hyperlink ended by ST), a carriage return, a bidi override, a
# line break, DEL, a C1 control and rich markup, in one module name
TERMINAL = "q_proj\x1b[31mESC\x1b]8;;http://e.vil\x1b\\L\x1b]8;;\x1b\\\r\u202eabc\nz\x7f\x9b[bold red]RED[/]"
TERMINAL_SHOWN = "q_proj\\x1b[31mESC\\x1b]8;;http://e.vil\\x1b\\L\\x1b]8;;\\x1b\\\\r\\u202eabc\\nz\\x7f\\x9b[bold red]RED[/]"
RAW = ("\x1b", "\r", "\u202e", "\x7f", "\x9b")


@pytest.fixture(scope="module")
def terminal_package(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("terminal")

    def tensor(name, entry):
        return {name.replace("layers.1.self_attn.q_proj.", f"layers.1.self_attn.{TERMINAL}."): entry}

    source = respell(FIXTURES / "qwen3-dense-fp8", root / "src", tensor, lambda c: c)
    convert(source, root / "out", ConvertOptions())
    return source, root / "out"


def test_the_terminal_gets_names_with_their_control_characters_as_escapes(terminal_package):
    from typer.testing import CliRunner

    from ascendconv.cli import app

    source, out = terminal_package
    weight = f"model.layers.1.self_attn.{TERMINAL_SHOWN}.weight"
    runner = CliRunner()
    listed = runner.invoke(app, ["inspect", str(source), "--tensors"])
    summary = runner.invoke(app, ["inspect", str(source)])
    verified = runner.invoke(app, ["verify", str(out), "--source", str(source)])
    for result in (listed, summary, verified):
        assert result.exit_code == 0, result.output
        assert not [c for c in RAW if c in result.stdout], result.stdout
    # each name whole, on its row's one line, its markup as text
    assert [line[len(weight):].split()[:2] for line in listed.stdout.splitlines() if line.startswith(weight + " ")] == [["F8_E4M3", "128×256"]]
    assert f"\nmodel.layers.*.self_attn.{TERMINAL_SHOWN}  1  W8A8_MXFP8 " in summary.stdout
    assert f"\n{weight}  W8A8_MXFP8 " in verified.stdout


def test_a_terminal_too_gets_no_control_character_of_a_name(terminal_package):
    import io

    from rich.console import Console

    from ascendconv.cli.render.inspect import render_inspect
    from ascendconv.cli.render.verify import render_verify
    from ascendconv.inspect import inspect_path
    from ascendconv.options import VerifyOptions
    from ascendconv.verify import verify

    source, out = terminal_package
    for render in (lambda c: render_inspect(inspect_path(source, tensors="*"), c),
                   lambda c: render_verify(verify(out, VerifyOptions(source=source)), c)):
        console = Console(file=io.StringIO(), force_terminal=True, color_system="standard", width=400)
        render(console)
        text = console.file.getvalue()
        assert TERMINAL_SHOWN in text and "\x1b]" not in text and "\x1b[31mESC" not in text
        assert not [c for c in RAW[1:] if c in text]
