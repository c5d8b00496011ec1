"""Fuzzing the JSON a checkpoint or a package is made of: shard headers, indexes, configs, the
description and the provenance of the bundled fixtures, mutated by hypothesis (derandomized, a
fixed example budget) and fed to the CLI in process.

Every input must end as the tool means it to: exit 0, a failed check (verify, exit 1) or a named
project error (exit 3), never a traceback; within a time bound; writing nothing outside OUT and
leaving the source untouched. A source convert accepts must give a package its own verify accepts.
A few examples run in real processes, with their peak memory measured.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES
from robust_helpers import (
    assert_clean,
    invoke,
    json_error,
    project_error_names,
    read_raw_header,
    tree_snapshot,
    write_raw_header,
)

EXAMPLES = {  # per target: 760 in all, plus 150 of the shape property
    "source_header": 100,
    "source_header_bytes": 80,
    "source_index": 50,
    "source_config": 70,
    "package_json": 140,
    "package_header": 40,
    "verify_options": 40,
    "convert_options": 40,
    "ct_fp8_config": 40,  # the other source formats' configs (tests/test_source_formats.py builds them)
    "ds_v4_config": 25,
    "float_config": 25,
    "part_manifest": 40,  # what assemble reads from a part directory
    "resume_ledger": 30,  # what convert --resume reads from a kept staging
    "mx_config": 40,  # the MX-native formats' configs (tests/mx_sources.py builds them)
}
SECONDS_PER_COMMAND = 20  # a generous bound; the commands take a fraction of a second here
RAN: dict[str, int] = {}  # examples run per target, reported at the end
OUTCOMES: dict[str, int] = {}  # exit codes seen, per command: that the fuzzing reaches past parsing


def fuzz_settings(target: str):
    return settings(
        max_examples=EXAMPLES[target],
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --- mutations of a JSON document --------------------------------------------------------------------

# Raw JSON text that Python parses into something hostile, spliced in where a sentinel string is.
RAW = {
    "@@HUGE_INT@@": "9" * 5000,  # past Python's int-string limit (4300 digits)
    "@@DEEP@@": "[" * 100_000 + "]" * 100_000,  # past the parser's recursion limit
    "@@NAN@@": "NaN",
    "@@INF@@": "1e999",
    "@@MINUS_INF@@": "-Infinity",
}
HOSTILE = [
    None, True, False, 0, -1, 1, 3, 32, 255, 2**31, 2**32 + 1, 2**62, 2**63, 2**64, 2**64 + 1, -(2**63), 0.5, -0.0, 1e300,
    "", "x", "F8_E4M3", "BF16", "U8", "F32", "I32", "FLOAT", "W8A8_MXFP8", "W4A8_MXFP", "1.0.0", "fp8", "dynamic",
    "é" * 3, "a" * 100_000, "../x", "/etc/passwd", "model.safetensors", "quant_model_weights.safetensors",
    [], {}, [1], [128, 128], [True, 1], [0, 2**64], ["a", 1, None], {"a": 1}, {"total_size": -1},
    *RAW,
]
KEYS = ["", "version", "metadata", "__metadata__", "weight_map", "dtype", "shape", "data_offsets", "x" * 10_000]


def paths(doc, prefix=(), limit=4000) -> list[tuple]:
    """Every path to a value in a JSON document (keys and list indices), the root excluded."""
    found: list[tuple] = []
    stack = [(prefix, doc)]
    while stack and len(found) < limit:
        path, node = stack.pop()
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            found.append(path + (key,))
            stack.append((path + (key,), child))
    return sorted(found, key=repr)


def _value(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _parent(doc, path):
    return _value(doc, path[:-1])


class Mutation:
    """New JSON text and the edits that made it (what a failing example shows, briefly)."""

    def __init__(self, text: str, edits: list):
        self.text, self.edits = text, edits

    def __repr__(self) -> str:
        return f"Mutation({self.edits!r})"[:400]

    def __iter__(self):  # text, edits = mutation
        return iter((self.text, self.edits))


@st.composite
def mutated(draw, doc):
    """A Mutation: one to three edits of `doc` (a parsed JSON document)."""
    doc = json.loads(json.dumps(doc))
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        where = paths(doc)
        op = draw(st.sampled_from(["set", "set", "set", "delete", "rename", "add"] if where else ["add"]))
        # a copy: a list or dict of HOSTILE edited in place by a later edit would change HOSTILE for
        # the examples after it (and could end up inside itself)
        value = copy.deepcopy(
            draw(st.one_of(st.sampled_from(HOSTILE), st.integers(-(2**65), 2**65), st.text(max_size=12)))
        )
        if op == "add":
            objects = [()] + [p for p in where if isinstance(_value(doc, p), dict)]
            target = _value(doc, draw(st.sampled_from(objects)))
            key = draw(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)))
            if isinstance(target, dict):
                target[key] = value
            edits.append(("add", key[:40], repr(value)[:40]))
            continue
        path = draw(st.sampled_from(where))
        parent = _parent(doc, path)
        key = path[-1]
        if op == "set":
            parent[key] = value
        elif op == "delete":
            del parent[key]
        elif isinstance(parent, dict):  # rename
            new = draw(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)))
            parent[new] = parent.pop(key)
        edits.append((op, repr(path)[:80], repr(value)[:40]))
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    for sentinel, raw in RAW.items():
        text = text.replace(json.dumps(sentinel), raw)
    return Mutation(text, edits)


# --- running the commands -------------------------------------------------------------------------

ERROR_NAMES = project_error_names()


def run(command: str, *args) -> object:
    started = time.monotonic()
    result = invoke(command, *args)
    assert time.monotonic() - started < SECONDS_PER_COMMAND, (command, args)
    assert_clean(result, command)
    OUTCOMES[f"{command} {result.exit_code}"] = OUTCOMES.get(f"{command} {result.exit_code}", 0) + 1
    if result.exit_code == 3 and "--json" in args:
        assert json_error(result)["error"] in ERROR_NAMES
    return result


class Workspace:
    """A fresh directory per example, removed on leaving the `with`: SRC (a fixture copy) or PKG,
    and the OUT convert may write."""

    def __init__(self, original: Path):
        self.dir = Path(tempfile.mkdtemp(prefix="fuzz-"))
        self.root = self.dir / original.name
        shutil.copytree(original, self.root)

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc_info) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def snapshot(self) -> dict:
        return tree_snapshot(self.dir)


def check_source(ws: Workspace, target: str) -> None:
    """convert, then inspect, the mutated source; a package convert writes must pass verify."""
    out = ws.dir / "out"
    before = ws.snapshot()
    result = run("convert", ws.root, out, "--quiet", "--json")
    assert result.exit_code in (0, 3), result.output
    after = {k: v for k, v in ws.snapshot().items() if not k.startswith("out/")}
    assert after == before, "convert changed files outside OUT (or the source)"
    if result.exit_code == 0:
        verdict = run("verify", out, "--source", ws.root, "--json")
        assert verdict.exit_code == 0, f"convert accepted a source its verify rejects: {verdict.stdout[:3000]}"
    else:
        assert not out.exists()
    run("inspect", ws.root, "--json")
    RAN[target] = RAN.get(target, 0) + 1


def check_package(ws: Workspace, target: str, *verify_extra: str) -> None:
    before = ws.snapshot()
    for args in (("--json", *verify_extra), ()):  # the numerical checks once: they are the slow part
        run("verify", ws.root, *args)
        run("inspect", ws.root, *args[:1])
    assert ws.snapshot() == before, "verify or inspect changed the package"
    RAN[target] = RAN.get(target, 0) + 1


# --- the targets ------------------------------------------------------------------------------------

DENSE = FIXTURES / "qwen3-dense-fp8"
MOE = FIXTURES / "qwen3-moe-fp8"
DENSE_HEADER = json.loads(read_raw_header(DENSE / "model.safetensors")[0])
MOE_INDEX = json.loads((MOE / "model.safetensors.index.json").read_text())
MOE_CONFIG = json.loads((MOE / "config.json").read_text())


@fuzz_settings("source_header")
@given(mutation=mutated(DENSE_HEADER))
def test_fuzz_source_header(mutation):
    text, _ = mutation
    with Workspace(DENSE) as ws:
        shard = ws.root / "model.safetensors"
        write_raw_header(shard, text.encode(), read_raw_header(shard)[1])
        check_source(ws, "source_header")


DENSE_PREFIX = len(read_raw_header(DENSE / "model.safetensors")[0]) + 8


@fuzz_settings("source_header_bytes")
@given(
    edits=st.lists(
        st.tuples(st.integers(0, DENSE_PREFIX - 1), st.sampled_from([0, 1, 0x20, 0x22, 0x5B, 0x7B, 0x7F, 0x80, 0xFF])),
        min_size=1,
        max_size=6,
    )
)
def test_fuzz_source_header_bytes(edits):
    """Bytes of the length prefix and of the header text itself, overwritten."""
    with Workspace(DENSE) as ws:
        shard = ws.root / "model.safetensors"
        raw = bytearray(shard.read_bytes())
        for position, value in edits:
            raw[position] = value
        shard.write_bytes(bytes(raw))
        check_source(ws, "source_header_bytes")


@fuzz_settings("source_index")
@given(mutation=mutated(MOE_INDEX))
def test_fuzz_source_index(mutation):
    text, _ = mutation
    with Workspace(MOE) as ws:
        (ws.root / "model.safetensors.index.json").write_text(text)
        check_source(ws, "source_index")


@fuzz_settings("source_config")
@given(mutation=mutated(MOE_CONFIG))
def test_fuzz_source_config(mutation):
    text, _ = mutation
    with Workspace(MOE) as ws:
        (ws.root / "config.json").write_text(text)
        check_source(ws, "source_config")


@pytest.fixture(scope="module")
def respelled(tmp_path_factory) -> dict[str, Path]:
    """The MoE fixture in the other source formats: compressed-tensors FP8, DeepSeek-V4 native
    (E8M0 `.scale`, from the DeepSeek fixture), and its BF16 master."""
    from test_source_formats import as_ct, as_ds_v4, as_float

    root = tmp_path_factory.mktemp("formats")
    return {
        "ct_fp8_config": as_ct(MOE, root / "ct"),
        "ds_v4_config": as_ds_v4(FIXTURES / "deepseek-v3-fp8", root / "v4", "F8_E8M0"),
        "float_config": as_float(MOE, root / "bf16"),
    }


def fuzz_format_config(respelled, data, target: str) -> None:
    base = json.loads((respelled[target] / "config.json").read_text())
    text, _ = data.draw(mutated(base))
    with Workspace(respelled[target]) as ws:
        (ws.root / "config.json").write_text(text)
        check_source(ws, target)


@fuzz_settings("ct_fp8_config")
@given(data=st.data())
def test_fuzz_ct_fp8_config(respelled, data):
    fuzz_format_config(respelled, data, "ct_fp8_config")


@fuzz_settings("ds_v4_config")
@given(data=st.data())
def test_fuzz_ds_v4_config(respelled, data):
    fuzz_format_config(respelled, data, "ds_v4_config")


@fuzz_settings("float_config")
@given(data=st.data())
def test_fuzz_float_config(respelled, data):
    fuzz_format_config(respelled, data, "float_config")


@pytest.fixture(scope="module")
def mx_sources(tmp_path_factory) -> dict[str, Path]:
    """The MoE fixture as each MX-native format stores it (tests/mx_sources.py)."""
    from mx_sources import MXFP4, MXFP8, as_mx, as_vllm_fused, experts_mxfp4

    root = tmp_path_factory.mktemp("mx")
    return {
        "ct": as_mx(MOE, root / "ct", "ct", lambda p: MXFP4 if ".experts." in p else MXFP8, weight_shape=True),
        "quark": as_mx(MOE, root / "quark", "quark", experts_mxfp4),
        "modelopt": as_mx(MOE, root / "modelopt", "modelopt", lambda p: MXFP8),
        "mxfp4-fused": as_vllm_fused(as_mx(MOE, root / "ct-mxfp4", "ct"), root / "mxfp4-fused"),
    }


@fuzz_settings("mx_config")
@given(data=st.data())
def test_fuzz_mx_source_config(mx_sources, data):
    """The configs of the MX-native formats (compressed-tensors groups, Quark's per-layer specs,
    ModelOpt's quant_algo, the fused MXFP4 layout's model_type), mutated: converted and verified,
    or refused by name."""
    layout = data.draw(st.sampled_from(sorted(mx_sources)))
    text, _ = data.draw(mutated(json.loads((mx_sources[layout] / "config.json").read_text())))
    with Workspace(mx_sources[layout]) as ws:
        (ws.root / "config.json").write_text(text)
        check_source(ws, "mx_config")


PACKAGE_FILES = (
    "quant_model_description.json",
    "quant_model_weights.safetensors.index.json",
    "ascendconv_provenance.json",
    "config.json",
)


@pytest.fixture(scope="module")
def moe_package(converted) -> Path:
    return converted("qwen3-moe-fp8", "w4a8-mxfp-moe", max_shard_size=200_000)


@fuzz_settings("package_json")
@given(data=st.data())
def test_fuzz_package_json(moe_package, data):
    file = data.draw(st.sampled_from(PACKAGE_FILES))
    text, _ = data.draw(mutated(json.loads((moe_package / file).read_text())))
    with Workspace(moe_package) as ws:
        (ws.root / file).write_text(text)
        check_package(ws, "package_json")


@fuzz_settings("package_header")
@given(data=st.data())
def test_fuzz_package_header(moe_package, data):
    shard = data.draw(st.sampled_from(sorted(p.name for p in moe_package.glob("*.safetensors"))))
    header, payload = read_raw_header(moe_package / shard)
    text, _ = data.draw(mutated(json.loads(header)))
    with Workspace(moe_package) as ws:
        write_raw_header(ws.root / shard, text.encode(), payload)
        check_package(ws, "package_header", "--source", str(MOE), "--exact", "--moe-check")


NUMBERS = ["-1", "0", "1", "2", "7", "64", "1e9", "nan", "inf", "-inf", "99999999999999999999", "abc", "", "0.5"]
VERIFY_OPTIONS = ["--tp", "--seed", "--moe-tokens", "--moe-layers", "--exact-rows", "--top", "--beta",
                  "--linear-beta", "--npu-tol", "--min-sqnr-mxfp8", "--min-sqnr-mxfp4", "--max-moe-rel-err"]
CONVERT_OPTIONS = {
    "--workers": NUMBERS,
    "--max-shard-size": NUMBERS + ["1KB", "0.5B", "4GiB", "1e3MB", "-5MB", "10 TiB"],
    "--scheme": ["w8a8-mxfp8", "w4a8-mxfp-moe", "W8A8", ""],
    "--scale-rule": ["floor", "mse", "x"],
    "--resolve-dtype": ["bf16", "fp32", "fp16"],
    "--override": ["*=FLOAT", "=W4A8_MXFP", "model.layers.0.*=W4A8_MXFP", "*.experts.*=W8A8_MXFP8", "x", "*=*"],
    "--kernel": ["numba", "reference", "cuda"],
}


@fuzz_settings("verify_options")
@given(options=st.lists(st.tuples(st.sampled_from(VERIFY_OPTIONS), st.sampled_from(NUMBERS)), max_size=4),
       flags=st.lists(st.sampled_from(["--exact", "--moe-check", "--no-checksums", "--quiet"]), max_size=2, unique=True))
def test_fuzz_verify_options(moe_package, options, flags):
    """Any option value is a usage error (exit 2) or a run: never a traceback."""
    args = [a for pair in options for a in pair] + flags + ["--source", str(MOE)]
    run("verify", moe_package, *args)
    RAN["verify_options"] = RAN.get("verify_options", 0) + 1


@fuzz_settings("convert_options")
@given(options=st.lists(st.sampled_from(sorted(CONVERT_OPTIONS)).flatmap(
    lambda o: st.tuples(st.just(o), st.sampled_from(CONVERT_OPTIONS[o]))), max_size=4))
def test_fuzz_convert_options(options):
    with Workspace(MOE) as ws:
        before = ws.snapshot()
        result = run("convert", ws.root, ws.dir / "out", "--dry-run", "--json", *[a for pair in options for a in pair])
        assert result.exit_code in (0, 2, 3), result.output
        assert ws.snapshot() == before and not (ws.dir / "out").exists()
    RAN["convert_options"] = RAN.get("convert_options", 0) + 1


# --- part manifests and resume ledgers: JSON that assemble and convert --resume read --------------

LIMIT = "150KB"  # the dense fixture in 4 to 6 shards


@pytest.fixture(scope="module")
def dense_parts(tmp_path_factory) -> Path:
    from ascendconv.convert import ConvertOptions, convert

    root = tmp_path_factory.mktemp("fuzz-parts")
    for i in (1, 2):
        convert(DENSE, root / f"p{i}", ConvertOptions(max_shard_size=150_000, part=(i, 2)))
    return root


@fuzz_settings("part_manifest")
@given(data=st.data())
def test_fuzz_part_manifest(dense_parts, data):
    part = data.draw(st.sampled_from(["p1", "p2"]))
    text, _ = data.draw(mutated(json.loads((dense_parts / part / "ascendconv_part.json").read_text())))
    with Workspace(dense_parts) as ws:
        (ws.root / part / "ascendconv_part.json").write_text(text)
        before = ws.snapshot()
        out = ws.dir / "out"
        result = run("assemble", out, ws.root / "p1", ws.root / "p2", "--quiet")
        assert ws.snapshot() == before or result.exit_code == 0, "assemble changed the parts"
        if result.exit_code == 0:  # an edit assemble accepts must still give a package verify accepts
            assert run("verify", out, "--quiet").exit_code == 0
        else:
            assert not out.exists()
    RAN["part_manifest"] = RAN.get("part_manifest", 0) + 1


@pytest.fixture(scope="module")
def kept_staging(tmp_path_factory) -> Path:
    """The staging a --resume run of the dense fixture kept when it was stopped half-way."""
    from ascendconv.convert import ConvertOptions, convert

    root = tmp_path_factory.mktemp("fuzz-resume")

    def stop(done, total):
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(DENSE, root / "out", ConvertOptions(max_shard_size=150_000, resume=True), stop)
    (staging,) = root.glob(".out.ascendconv-staging-*")
    return staging


@fuzz_settings("resume_ledger")
@given(data=st.data())
def test_fuzz_resume_ledger(kept_staging, data):
    text, _ = data.draw(mutated(json.loads((kept_staging / ".ascendconv-resume.json").read_text())))
    work = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        staging = work / kept_staging.name
        shutil.copytree(kept_staging, staging)
        (staging / ".ascendconv-resume.json").write_text(text)
        result = run("convert", DENSE, work / "out", "--resume", "--quiet", "--json", "--max-shard-size", LIMIT)
        if result.exit_code == 0:  # whatever the ledger said, the package must be right
            assert run("verify", work / "out", "--source", DENSE, "--quiet").exit_code == 0
        else:
            assert not (work / "out").exists()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    RAN["resume_ledger"] = RAN.get("resume_ledger", 0) + 1


def test_fuzz_budget_was_spent():
    """Every target ran its examples (hypothesis stops early only when it runs out of inputs)."""
    if len(RAN) < len(EXAMPLES):
        pytest.skip("run with the fuzz tests above (this one reports their counts)")
    print(f"\nfuzz examples run: {sum(RAN.values())} ({', '.join(f'{k} {v}' for k, v in sorted(RAN.items()))})")
    print(f"exit codes: {', '.join(f'{k}: {v}' for k, v in sorted(OUTCOMES.items()))}")
    for target, count in RAN.items():
        assert count >= EXAMPLES[target] * 0.9, (target, count)


# --- a few in real processes: exit codes, stderr, and peak memory -----------------------------------

HOSTILE_FILES = [
    ("config.json", '{"quantization_config": ' + RAW["@@DEEP@@"] + "}"),
    ("config.json", '{"quantization_config": {"quant_method": "fp8", "weight_block_size": [' + RAW["@@HUGE_INT@@"] + ", 128]}}"),
    ("model.safetensors.index.json", '{"weight_map": {"a": 1, "b": null, "c": ["x"]}}'),
    ("model.safetensors.index.json", '{"weight_map": ' + RAW["@@DEEP@@"] + "}"),
]


@pytest.mark.parametrize("file,text", HOSTILE_FILES, ids=["config-deep", "config-huge-int", "index-types", "index-deep"])
def test_hostile_json_in_a_real_process(tmp_path, file, text):
    src = tmp_path / "src"
    shutil.copytree(MOE, src)
    (src / file).write_text(text)
    before = tree_snapshot(tmp_path)
    # VmHWM is this process's own high-water mark; ru_maxrss would also carry the forked pytest's
    # (Linux keeps it across exec), which is over 1 GiB late in a full run.
    code = (
        "import re, sys\n"
        "from ascendconv.cli import app\n"
        "try:\n    app()\n"
        "finally:\n"
        "    hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
        "    print('peak_kib', hwm, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "convert", str(src), str(tmp_path / "out"), "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads(done.stdout.splitlines()[0])["error"] in ERROR_NAMES
    peak = int(done.stderr.rsplit("peak_kib", 1)[1].split()[0])
    assert peak < 1024 * 1024, f"peak RSS {peak} KiB"
    assert tree_snapshot(tmp_path) == before


# --- shapes: ours and the safetensors library's bounds agree -----------------------------------------

DIMS = [0, 1, 3, 2**31, 2**32, 2**61, 2**62, 2**63, 2**64 - 1, 2**64, True, False, -1, 1.0]


@settings(max_examples=150, derandomize=True, deadline=None, database=None)
@given(
    dtype=st.sampled_from(["U8", "BF16", "F32", "F64", "F8_E4M3"]),
    shape=st.lists(st.sampled_from(DIMS), max_size=4).filter(lambda s: 0 in s and False not in s or not s),
)
def test_header_bounds_agree_with_the_safetensors_library(dtype, shape):
    """A zero-element tensor of any shape: read_header accepts it exactly when safetensors does."""
    from safetensors import safe_open

    from ascendconv.errors import HeaderError
    from ascendconv.io.safetensors import read_header

    nbytes = 0 if shape else {"U8": 1, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1}[dtype]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.safetensors"
        header = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
        write_raw_header(path, header, bytes(nbytes))
        try:
            with safe_open(str(path), "np") as f:
                theirs = list(f.keys()) == ["t"]
        except Exception:
            theirs = False
        try:
            ours = list(read_header(path).tensors) == ["t"]
        except HeaderError:
            ours = False
    assert ours == theirs, (dtype, shape, ours, theirs)
