"""convert --part I/N and assemble: parts converted in separate processes join into a package that is
byte-identical to a one-process conversion; parts that do not make up one plan are refused and
nothing is written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ascendconv.cli import app
from ascendconv.convert import ConvertOptions, convert
from ascendconv.errors import BadOptionError
from ascendconv.parts import assign_parts, parse_part
from conftest import FIXTURE_NAMES, FIXTURES

runner = CliRunner()
SHARD_LIMIT = 150_000
# fixture -> scheme and shard limit that make its package 4 to 6 shards
WRITTEN_AS = {
    "qwen3-dense-fp8": ("w8a8-mxfp8", SHARD_LIMIT),
    "qwen3-moe-fp8": ("w4a8-mxfp-moe", 100_000),
    "deepseek-v3-fp8": ("w4a8-mxfp", 100_000),
}


def tree(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def test_assignment_is_largest_first_into_the_lightest_part():
    # 5 -> p1, 5 -> p2, 3 -> p1 (tie: lower part), 3 -> p2, 2 -> p1
    assert assign_parts([5, 5, 3, 3, 2], 2) == [[0, 2, 4], [1, 3]]
    assert assign_parts([1, 9, 1, 1], 2) == [[1], [0, 2, 3]]
    assert assign_parts([4, 4], 3) == [[0], [1], []]


@given(st.lists(st.integers(0, 10**9), max_size=40), st.integers(1, 12))
def test_assignment_holds_every_shard_once_and_is_balanced(sizes, count):
    parts = assign_parts(sizes, count)
    assert sorted(i for part in parts for i in part) == list(range(len(sizes)))
    loads = [sum(sizes[i] for i in part) for part in parts]
    # greedy largest-first: no part exceeds the lightest by more than the largest shard
    assert max(loads) - min(loads) <= max(sizes, default=0)
    assert assign_parts(list(sizes), count) == parts  # a pure function


@pytest.mark.parametrize("text", ["0/3", "4/3", "2", "a/b", "1/0", "-1/2"])
def test_part_must_be_i_of_n(text):
    with pytest.raises(BadOptionError, match="cannot read --part") as refused:
        parse_part(text)
    assert "1 <= I <= N" in refused.value.hint


def test_a_part_count_of_more_digits_than_int_reads_is_a_usage_error_not_a_traceback():
    """int() refuses more than 4,300 digits: `--part 1/99...9` (5,000 nines) ended in a ValueError traceback, exit 1."""
    text = "1/" + "9" * 5000
    result = runner.invoke(app, ["convert", str(FIXTURES / "qwen3-dense-fp8"), "unused", "--part", text, "--json"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert json.loads(result.stdout) == {
        "ok": False, "schema": 1, "command": "convert", "error": "BadOptionError", "exit_code": 2,
        "message": f"cannot read --part '1/{'9' * 131}…{'9' * 133}' (5004 chars)",  # clipped, quotes and all
        "hint": "write --part I/N with 1 <= I <= N, e.g. --part 2/4",
    }


def convert_parts_in_processes(src: Path, root: Path, counts: list[int], *options: str) -> dict[int, list[Path]]:
    """For each N in `counts`, parts 1..N each by its own `python -m ascendconv` process (all at once)."""
    dirs = {n: [root / f"part-{i}-of-{n}" for i in range(1, n + 1)] for n in counts}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "ascendconv", "convert", str(src), str(d), "--part", f"{i}/{n}", "--quiet", *options],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for n in counts
        for i, d in enumerate(dirs[n], start=1)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
    return dirs


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_parts_assemble_into_the_one_process_package(fixture, converted, tmp_path):
    scheme, limit = WRITTEN_AS[fixture]
    golden = converted(fixture, scheme, max_shard_size=limit)
    shards = [p.name for p in golden.iterdir() if p.suffix == ".safetensors"]
    assert len(shards) >= 4
    counts = sorted({1, 2, 3, len(shards)})
    made = convert_parts_in_processes(FIXTURES / fixture, tmp_path, counts, "--scheme", scheme, "--max-shard-size", str(limit))
    for count, parts in made.items():
        held = [sorted(json.loads((d / "ascendconv_part.json").read_text())["shards"]) for d in parts]
        assert sorted(s for h in held for s in h) == sorted(shards)
        if count == len(shards):
            assert all(len(h) == 1 for h in held)
        out = tmp_path / f"package-{count}"
        result = runner.invoke(app, ["assemble", str(out), *map(str, reversed(parts)), "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["shards"] == len(shards)
        assert tree(out) == tree(golden)


@pytest.fixture(scope="module")
def dense_parts(tmp_path_factory):
    """Parts 1..3 of the dense fixture, and foreign parts 3/3: another source, another scale rule."""
    root = tmp_path_factory.mktemp("parts")
    made = {}
    for key, fixture, rule in (("dense", "qwen3-dense-fp8", "mse"), ("moe", "qwen3-moe-fp8", "mse"), ("floor", "qwen3-dense-fp8", "floor")):
        for i in range(1, 4):
            made[key, i] = root / key / f"p{i}"
            convert(FIXTURES / fixture, made[key, i], ConvertOptions(scale_rule=rule, max_shard_size=SHARD_LIMIT, part=(i, 3)))
    return made


def assemble_refused(tmp_path: Path, *parts: Path) -> str:
    out = tmp_path / "pkg" / "out"
    result = runner.invoke(app, ["assemble", str(out), *map(str, parts), "--quiet"])
    assert result.exit_code == 3, result.output
    assert not (tmp_path / "pkg").exists()  # nothing written, not even the parent or a lock
    assert "Traceback" not in result.output
    return " ".join(result.stderr.split())


def copy_part(part: Path, target: Path) -> Path:
    shutil.copytree(part, target)
    return target


def test_a_missing_part_is_refused(dense_parts, tmp_path):
    message = assemble_refused(tmp_path, dense_parts["dense", 1], dense_parts["dense", 3])
    assert "part 2 of 3 missing" in message


def test_a_duplicated_part_is_refused(dense_parts, tmp_path):
    twin = copy_part(dense_parts["dense", 2], tmp_path / "twin")
    message = assemble_refused(tmp_path, *(dense_parts["dense", i] for i in (1, 2, 3)), twin)
    assert "part 2/3 is given twice" in message and str(twin) in message


@pytest.mark.parametrize("key, differs", [("moe", "provenance.source"), ("floor", "scale_rule: 'floor' now, 'mse' there")])
def test_a_part_of_another_source_or_other_options_is_refused(dense_parts, tmp_path, key, differs):
    message = assemble_refused(tmp_path, dense_parts["dense", 1], dense_parts["dense", 2], dense_parts[key, 3])
    assert "comes from another plan" in message and differs in message


def test_a_tampered_shard_is_refused(dense_parts, tmp_path):
    parts = [copy_part(dense_parts["dense", i], tmp_path / f"p{i}") for i in (1, 2, 3)]
    shard = next(parts[1].glob("quant_model_weights-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    message = assemble_refused(tmp_path, *parts)
    assert str(shard) in message and "recorded" in message


def test_a_removed_shard_or_an_edited_manifest_is_refused(dense_parts, tmp_path):
    parts = [copy_part(dense_parts["dense", i], tmp_path / f"p{i}") for i in (1, 2, 3)]
    shard = next(parts[0].glob("quant_model_weights-*.safetensors"))
    shard.unlink()
    assert f"{shard.name}: is not in {parts[0]}, though part 1/3 ({parts[0]})'s manifest lists it" in assemble_refused(
        tmp_path, *parts
    )
    shutil.copyfile(dense_parts["dense", 1] / shard.name, shard)
    manifest = parts[2] / "ascendconv_part.json"
    data = json.loads(manifest.read_text())
    data["identity"]["options"]["scale_rule"] = "floor"  # claims another plan without its bytes
    manifest.write_text(json.dumps(data))
    assert "does not match its fingerprint" in assemble_refused(tmp_path, *parts)


def test_a_removed_or_replaced_small_file_of_a_part_is_named_as_such(dense_parts, tmp_path):
    """A part's config.json removed was said to "differ from what the manifest records"; one replaced
    by a directory got the hint to pass part directories convert wrote, which it was."""
    parts = [copy_part(dense_parts["dense", i], tmp_path / f"p{i}") for i in (1, 2, 3)]
    config = parts[1] / "config.json"
    config.unlink()
    assert assemble_refused(tmp_path, *parts) == (
        f"error: {config}: is not in {parts[1]}, though part 2/3 ({parts[1]})'s manifest lists it "
        "hint: the part was modified or damaged after it was written; run that part again"
    )
    config.mkdir()
    assert assemble_refused(tmp_path, *parts) == (
        f"error: {config}: is a directory, not a regular file "
        "hint: the part was modified or damaged after it was written; run that part again"
    )


def test_a_directory_that_is_not_a_part_is_refused(converted, dense_parts, tmp_path):
    package = converted("qwen3-dense-fp8", max_shard_size=SHARD_LIMIT)
    message = assemble_refused(tmp_path, dense_parts["dense", 1], package)
    assert "is not a part directory" in message


def test_a_part_given_as_a_file_a_mistyped_name_or_a_dangling_link_is_named_as_such(dense_parts, tmp_path):
    """assemble said "no such directory" of a file that exists, and gave no hint for a mistyped part
    or a dangling link: every other command names them (io/hfcache.local_directory)."""
    part = copy_part(dense_parts["dense", 1], tmp_path / "p1")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    cases = {
        tmp_path / "afile": ("UnrecognizedCheckpointError", f"{tmp_path / 'afile'}: is a file; assemble takes a directory",
                             f"did you mean {tmp_path}?"),
        tmp_path / "p1x": ("NotFoundError", f"{tmp_path / 'p1x'}: no such directory", f"did you mean {part}?"),
        tmp_path / "dangling": ("NotFoundError", f"{tmp_path / 'dangling'}: no such directory",
                                f"{tmp_path / 'dangling'} is a symbolic link to {tmp_path / 'nowhere'}, which leads to no directory; fix the link"),
    }
    for given, (code, message, hint) in cases.items():
        result = runner.invoke(app, ["assemble", str(tmp_path / "pkg" / "out"), str(part), str(given), "--json"])
        assert result.exit_code == 3 and "Traceback" not in result.output
        assert json.loads(result.stdout) == {"ok": False, "schema": 1, "command": "assemble", "error": code,
                                             "message": message, "hint": hint, "exit_code": 3}
    assert not (tmp_path / "pkg").exists()


def test_more_parts_than_shards_is_refused_before_any_work(converted, tmp_path):
    golden = converted("qwen3-dense-fp8", max_shard_size=SHARD_LIMIT)
    shards = len(list(golden.glob("*.safetensors")))
    for count in (shards + 1, 10**12):  # 10**12 parts once meant a list of 10**12 before any check
        with pytest.raises(BadOptionError, match=rf"{count} parts, but the plan has {shards} shard") as refused:
            convert(FIXTURES / "qwen3-dense-fp8", tmp_path / "p", ConvertOptions(max_shard_size=SHARD_LIMIT, part=(1, count)))
        assert f"at most {shards} parts" in refused.value.hint
    assert not (tmp_path / "p").exists()
    result = runner.invoke(
        app, ["convert", str(FIXTURES / "qwen3-dense-fp8"), str(tmp_path / "p"), "--part", "1/1000000000000", "--quiet"]
    )
    assert result.exit_code == 2 and "1000000000000 parts" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize("option, message, hint", [
    (["--part", "1/2"], "--part 1/2: 2 parts, but the plan has 1 shard to share out",
     "choose at most 1 part, or a smaller --max-shard-size for more shards"),
    (["--part", "1/9", "--max-shard-size", str(SHARD_LIMIT)], "--part 1/9: 9 parts, but the plan has 5 shards to share out",
     "choose at most 5 parts, or a smaller --max-shard-size for more shards"),
])
def test_the_part_count_refusal_reads_in_the_singular_and_the_plural(tmp_path, option, message, hint):
    """A one-shard plan was told "the plan has 1 shard(s)" and "choose at most 1 parts"."""
    result = runner.invoke(app, ["convert", str(FIXTURES / "qwen3-dense-fp8"), str(tmp_path / "p"), *option, "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"ok": False, "schema": 1, "command": "convert", "error": "BadOptionError",
                                         "message": message, "hint": hint, "exit_code": 2}
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("where, code, error, message, hint", [
    ("a part", "OutputExistsError", 2, "{out}: the output directory is the part directory", "choose an OUT other than the part"),
    ("in a part", "UnsafeOutputError", 2, "{out}: the output directory lies inside the part {part}",
     "choose a new or empty directory outside the part"),
])
def test_an_out_that_is_or_lies_in_a_part_is_named_whichever_part_comes_first(dense_parts, tmp_path, where, code, error, message, hint):
    """OUT = the last part given was checked against the first part first: "exists and is not
    empty", hint "pass --overwrite", which then refused it as the part directory."""
    parts = [copy_part(dense_parts["dense", i], tmp_path / f"p{i}") for i in (1, 2, 3)]
    out = parts[2] if where == "a part" else parts[2] / "sub"
    before = tree(parts[2])
    result = runner.invoke(app, ["assemble", str(out), *map(str, parts), "--json"])
    data = json.loads(result.stdout)
    assert (result.exit_code, data["error"]) == (error, code)
    assert (data["message"], data["hint"]) == (message.format(out=out, part=parts[2]), hint)
    assert tree(parts[2]) == before
