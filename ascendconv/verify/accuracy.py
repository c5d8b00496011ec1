"""Checks against the source: the tensor set it implies (source), the error of every weight
(accuracy) and the package bytes re-derived from it (exact)."""

from __future__ import annotations

import collections
import math
import os
import threading
import zlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ascendconv.ascendv1 import PROVENANCE_NAME, SOURCE_DATA_KEY
from ascendconv.errors import HeaderError, NaNCodeError, NonFiniteScaleError, NonFiniteValueError, plural, shown
from ascendconv.formats import requantize
from ascendconv.ascendv1 import MX_TYPES, QUANT_TYPES
from ascendconv.formats.constants import FLOAT, GROUP_SIZE, RESOLVE_DTYPES, SCALE_RULES, transform_for
from ascendconv.formats.metrics import ErrorAccumulator, ErrorStats
from ascendconv.io.safetensors import TensorEntry, TensorReader
from ascendconv.sources.rows import entry_points, linear_rows
from ascendconv.verify.checks import STRUCTURAL_HINT, make_check, skip_check
from ascendconv.verify.layout import CHUNK_BYTES, FLOAT_DTYPES, _Layout, _Module, _row_chunks
from ascendconv.verify.rows import _dequantize, _mapped_rows, _read_package_rows
from ascendconv.options import Notice, VerifyProgress as Progress, VerifyOptions
from ascendconv.verify.report import Check, TensorReport


STATS_ELEMENTS = 2**15  # elements per weight whose error --source measures (every row: --exact-full)


def _sample_rows(n: int, count: int, seed: int, name: str) -> np.ndarray:
    """Deterministic rows of a tensor: the first, the last, and random ones (all when few)."""
    if count >= n:
        return np.arange(n)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    middle = rng.choice(np.arange(1, n - 1), size=max(0, count - 2), replace=False) if n > 2 else []
    return np.unique(np.concatenate([[0, n - 1], middle]).astype(np.int64))


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """a == b everywhere, compared 8 bytes at a time where the layout allows (8x fewer elements)."""
    if a.shape != b.shape:
        return False
    if a.nbytes % 8 == 0 and a.flags.c_contiguous and b.flags.c_contiguous:
        a, b = a.reshape(-1).view(np.uint64), b.reshape(-1).view(np.uint64)
    return bool(np.array_equal(a, b))


class _Differences:
    """Bytes of one tensor that differ from the reference, counted over chunks; the first kept."""

    def __init__(self, name: str, what: str):
        self.name, self.what = name, what
        self.count = 0
        self.rows: set[int] = set()
        self.first: tuple[int, int, int, int] | None = None  # row, byte, package, reference

    def update(self, got: np.ndarray, want: np.ndarray, rows: np.ndarray) -> None:
        """`got` and `want`: uint8 arrays with one row per entry of `rows`."""
        if _same_bytes(got, want):
            return
        diff = got != want
        where = np.argwhere(diff)
        self.count += len(where)
        self.rows.update(int(rows[r]) for r in np.unique(where[:, 0]))
        if self.first is None:
            at = tuple(where[0])
            self.first = (int(rows[at[0]]), int(at[1]), int(got[at]), int(want[at]))

    def message(self) -> str | None:
        if self.first is None:
            return None
        row, byte, got, want = self.first
        return (
            f"{self.name!r} {self.what}: {plural(self.count, 'byte')} in {plural(len(self.rows), 'row')} "
            f"{'differs' if self.count == 1 else 'differ'} from the reference; "
            f"first at row {row}, byte {byte}: package 0x{got:02X}, reference 0x{want:02X}"
        )


@dataclass
class _SourceFindings:
    source: list[str] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)
    exact_rows: int = 0  # rows re-derived with the numpy reference (--exact)
    rows: int = 0  # rows re-derived with the compiled kernels
    rows_of: int = 0  # rows of the weights compared
    tensors: list[TensorReport] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    relaid: int = 0  # MX source tensors proven: package bytes == source bytes after their transform

    def add(self, compared: "_Compared") -> None:
        self.source += compared.source
        self.exact += compared.exact
        self.exact_rows += compared.reference_rows
        self.skipped += compared.skipped
        if compared.report is not None:
            self.tensors.append(compared.report)


def _module_measurable(lay: _Layout, module: _Module, linear) -> str | None:
    """Why a module cannot be compared with its source linear, or None."""
    w = module.weight
    if w is None:
        return "not stored"
    n, k = linear.shape
    if module.label == FLOAT:
        if w.dtype != "BF16" or w.shape != (n, k):
            return f"FLOAT weight is {w.dtype} {list(w.shape)}, expected BF16 {[n, k]}"
        return None
    if module.label not in MX_TYPES:
        return f"unknown type {module.label!r}"
    quant_type = QUANT_TYPES[module.label]
    want_dtype, want_shape = quant_type.weight_dtype, quant_type.weight_shape(n, k)
    if w.dtype != want_dtype or w.shape != want_shape or k % quant_type.k_per_byte:
        return f"{module.label} weight is {w.dtype} {list(w.shape)}, expected {want_dtype} {list(want_shape)}"
    s = module.scale
    if s is None or s.dtype != "U8" or s.shape != quant_type.scale_shape(n, k) or k % GROUP_SIZE:
        return "scale missing or misshapen"
    return None


def _compare_source(
    lay: _Layout, source, options: VerifyOptions, progress: Progress | None, notice: Notice | None = None
) -> _SourceFindings:
    from ascendconv.package_files import data_sample, source_fingerprint, tensor_sample
    from ascendconv.pipeline import entry_digest, made_from

    found = _SourceFindings()
    prov = lay.pkg.record
    rule = prov.scale_rule if prov.scale_rule in SCALE_RULES else None
    resolve_dtype = prov.resolve_dtype if prov.resolve_dtype in RESOLVE_DTYPES else "bf16"

    # 1. is this the source the package was made from?
    recorded = prov.source_files
    if recorded is not None:
        # a name of another type than a string (a list: unhashable) is no shard of any source
        want = {f["name"]: f for f in recorded if isinstance(f, dict) and isinstance(f.get("name"), str)}
        # the sample each package recorded: every tensor's windows, the shard's only (packages of
        # before), or none (older still)
        samples = {"tensor_sample": tensor_sample, "data_sample": data_sample}
        sampled = {name: next((k for k in samples if k in f), None) for name, f in want.items()}
        have = {
            h.path.name: (h.file_size, source_fingerprint(h.header_bytes, h.file_size))
            + ((samples[kind](h),) if (kind := sampled.get(h.path.name)) else ())
            for h in source.headers
        }
        want = {
            name: (f.get("size"), f.get("fingerprint")) + ((f[sampled[name]],) if sampled[name] else ())
            for name, f in want.items()
        }
        if set(have) != set(want):
            found.source.append(
                f"the package was converted from shards {sorted(want)}, the source given has {sorted(have)}"
            )
        else:
            for name in sorted(have):
                if have[name] != want[name]:
                    found.source.append(
                        f"source shard {name} differs from the one converted (size {have[name][0]} vs recorded "
                        f"{want[name][0]}, or another header, or other data)"
                    )
        if found.source and (snapshots := _other_snapshot(prov.hub, source.root)):
            found.source.append(snapshots)

    # 2. the tensor set the source implies
    by_weight = {linear.weight.name: linear for linear in source.linears.values()}
    heads = _added_tensors(prov, source)
    found.source += _added_problems(prov.added_tensors, heads)
    recorded, made_of, to_hash = _data_to_hash(lay, source, by_weight, heads)
    data_at = len(found.source)  # where their findings go, once the tensors are hashed
    scale_names = source.scale_names
    implied: set[str] = set()
    for name in source.tensors:
        if name in scale_names:
            continue
        linear = by_weight.get(name)
        implied.add(name if linear is None else linear.prefix + ".weight")  # MX sources may name it otherwise
        if linear is not None and lay.label(linear.prefix + ".weight") in MX_TYPES:
            implied.add(linear.prefix + ".weight_scale")
    # tensors convert added (the MTP drafter's heads): copies of a source tensor
    added = {name: source.tensors[src] for name, src in heads.items() if src in source.tensors}
    implied |= set(added)
    for name in sorted(implied - set(lay.tensors)):
        if lay.complete:
            found.source.append(f"{name!r} comes from the source but is not in the package")
    for name in sorted(set(lay.tensors) - implied):
        found.source.append(f"package tensor {name!r} does not come from the source")

    def package_name(name: str) -> str:
        linear = by_weight.get(name)
        return name if linear is None else linear.prefix + ".weight"

    work = [(n, e) for n, e in source.tensors.items() if n not in scale_names and package_name(n) in lay.tensors]
    work += [(n, e) for n, e in added.items() if n in lay.tensors]
    total = sum(e.nbytes for _, e in work)
    derive = _Rederive(lay, source, options, rule, resolve_dtype, set(heads.values()), notice)
    # each tensor a digest needs is hashed by the first item that reads it, just before that item
    # compares it: every source byte comes from the disk once, not once per pass
    hashed_with = [
        [t for t in made_from(source, by_weight, e.name) if to_hash.pop(t.name, None) is not None] for _, e in work
    ]

    def compare(item: tuple[str, TensorEntry]) -> _Compared:
        name, entry = item
        head = by_weight.get(entry.name) if name != entry.name else None  # an added copy of a linear's weight
        if head is not None and not head.copied_when_float:
            return _Compared(source=[p for p in [derive.resolved_copy(reader, head, name)] if p])
        linear = by_weight.get(entry.name) if name == entry.name else None
        if linear is None or (linear.copied_when_float and lay.label(entry.name) == FLOAT):
            return _Compared(source=[p for p in [_compare_plain(lay, reader, source, entry, name)] if p])
        module = lay.modules.get(linear.prefix)
        why = "not described" if module is None else _module_measurable(lay, module, linear)
        if why is not None:
            return _Compared(skipped=[f"{entry.name}: {why}"])
        return derive.linear(reader, linear, module)

    def compare_and_hash(item: tuple[tuple[str, TensorEntry], list[TensorEntry]]) -> tuple[_Compared, dict[str, bytes]]:
        digests = {t.name: entry_digest(source, t) for t in item[1]}
        return compare(item[0]), digests

    done, digests = 0, {}
    with TensorReader() as reader:
        # tensors in parallel (kernels, numpy and reads release the GIL), results taken in order
        items = list(zip(work, hashed_with))
        for ((_, entry), _), (compared, hashed) in _ordered_map(compare_and_hash, items, os.cpu_count() or 1):
            found.add(compared)
            digests.update(hashed)
            done += entry.nbytes
            if progress:
                progress("source", done, total)
    digests.update(_digests(source, list(to_hash.values()), progress))  # those no compared item reads
    found.source[data_at:data_at] = _data_problems(recorded, made_of, digests)
    found.rows, found.rows_of, found.relaid = derive.rows, derive.rows_of, derive.relaid
    return found


def _other_snapshot(hub: dict | None, root) -> str | None:
    """When the shards differ and both the snapshot converted (the recorded hub) and the source given
    are snapshots of the Hugging Face cache, of other revisions, which were they: the commonest
    cause, a cache whose main moved on since. Otherwise None: a local copy of a snapshot is the same
    source, and another revision of the same bytes is refuted by nothing, so neither is a finding."""
    from ascendconv.io.hfcache import cached_repo

    given = cached_repo(root)
    if hub is None or given is None or given == (hub["repo_id"], hub["revision"]):
        return None
    converted = f"{hub['repo_id']}@{hub['revision']}"
    return f"the package was converted from {shown(converted)}, the source given is {given[0]}@{given[1]}: pass --source {shown(converted)}"


def _added_tensors(prov, source) -> dict[str, str]:
    """The tensors convert adds from this source (the MTP drafter's heads: models.ModelRules.mtp_heads),
    name -> the source tensor each copies, under the recorded --mtp-heads switch; the ones the package
    records where it records no switch (a package of before it). Taken from the source, not from the
    provenance: a package whose head holds another tensor, and says so, is not what convert writes."""
    from ascendconv.models import rules_for

    switch = (prov.deployment or {}).get("mtp_heads")
    if switch is None:
        return dict(prov.added_tensors)
    if not switch:
        return {}
    return {added.name: added.source for added in rules_for(source.config, source.tensors).mtp_heads(source.tensors)}


def _added_problems(recorded: dict[str, str], heads: dict[str, str]) -> list[str]:
    """Each tensor the provenance records as added otherwise than convert adds it from the source."""
    problems = []
    for name in sorted(recorded.keys() | heads.keys()):
        said, made = recorded.get(name), heads.get(name)
        if said == made:
            continue
        if made is None:
            problems.append(f"{PROVENANCE_NAME} records {name!r} as added (a copy of {said!r}), but convert adds no such "
                            "tensor from this source under the recorded --mtp-heads")
        elif said is None:
            problems.append(f"convert adds {name!r} (a copy of {made!r}) from this source for the MTP drafter, and "
                            f"{PROVENANCE_NAME} does not record it")
        else:
            problems.append(f"{PROVENANCE_NAME} records {name!r} as a copy of {said!r}, but convert copies {made!r} "
                            "from this source")
    return problems


def _data_to_hash(
    lay: _Layout, source, by_weight: dict, added: dict[str, str]
) -> tuple[dict[str, str], dict[str, list | None], dict[str, TensorEntry]]:
    """What proves each package shard was made from the source given, where the shard records the
    digest of the source bytes it was made from (packages of before do not): the recorded digests,
    shard -> its source tensors (None: a tensor of it does not come from the source, reported
    apart), and those tensors by name, to hash (`added`: each added tensor's source tensor). The proof
    that the sampled identity of the source only makes likely."""
    from ascendconv.pipeline import made_from

    shards = lay.pkg.record.shards or {}
    recorded = {name: e[SOURCE_DATA_KEY] for name, e in shards.items() if isinstance(e, dict) and isinstance(e.get(SOURCE_DATA_KEY), str)}
    if not recorded:
        return {}, {}, {}
    by_prefix = {linear.prefix: linear for linear in source.linears.values()}
    made_of: dict[str, list | None] = {name: [] for name in recorded}  # shard -> source tensors; None: unknown
    for name, entry in lay.tensors.items():
        shard = entry.path.name
        if made_of.get(shard) is None:
            continue
        prefix, _, last = name.rpartition(".")
        if name in added:
            origin = added[name]
        elif prefix in by_prefix and last == "weight":
            origin = by_prefix[prefix].weight.name
        elif prefix in by_prefix and last == "weight_scale":
            continue  # made with its weight, from the weight's sources
        else:
            origin = name
        if origin in source.tensors:
            made_of[shard] += made_from(source, by_weight, origin)
        else:
            made_of[shard] = None  # a tensor that does not come from the source: reported apart
    return recorded, made_of, {e.name: e for sources in made_of.values() if sources for e in sources}


def _digests(source, entries: list[TensorEntry], progress: Progress | None) -> dict[str, bytes]:
    """The digest of each of `entries` (hashed in parallel)."""
    from ascendconv.pipeline import entry_digest

    digests, done, total = {}, 0, sum(e.nbytes for e in entries)
    for entry, digest in _ordered_map(lambda e: entry_digest(source, e), entries, os.cpu_count() or 1):
        digests[entry.name] = digest
        done += entry.nbytes
        if progress:
            progress("source-data", done, total)
    return digests


def _data_problems(recorded: dict[str, str], made_of: dict[str, list | None], digests: dict[str, bytes]) -> list[str]:
    """Each shard whose recorded digest of source bytes is not that of the source given."""
    from ascendconv.io.checksum import reads_digest

    problems = []
    for shard, sources in sorted(made_of.items()):
        if sources is not None and reads_digest({e.name: digests[e.name] for e in sources}) != recorded[shard]:
            problems.append(f"package shard {shard} was made from other source bytes than the source given holds "
                            f"(its recorded {SOURCE_DATA_KEY} differs): a fine-tune, another revision, a source "
                            "changed since it was converted, or tensors of this shard moved to another or removed "
                            "since it was written")
    return problems


def _ordered_map(function, items: list, workers: int) -> Iterator[tuple]:
    """(item, function(item)) in the order of `items`, computed by `workers` threads with at most
    2 x workers results in flight (memory stays bounded)."""
    from concurrent.futures import ThreadPoolExecutor

    from ascendconv.io.threads import threads_started

    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            with threads_started(workers_option=False):  # the pool starts its threads as work is submitted
                future = pool.submit(function, item)
            pending.append((item, future))
            while len(pending) >= 2 * workers:
                item_done, future = pending.popleft()
                yield item_done, future.result()
        while pending:
            item_done, future = pending.popleft()
            yield item_done, future.result()


def _compare_plain(lay: _Layout, reader: TensorReader, source, entry: TensorEntry, name: str) -> str | None:
    """A tensor convert copies (bytes as they are, under its own name or the one it was added as)
    or casts (an MX layer's bias to F32)."""
    pkg = lay.tensors[name]
    if pkg.shape != entry.shape:
        return f"{name!r} has shape {list(pkg.shape)} in the package, {list(entry.shape)} in the source"
    if pkg.dtype == entry.dtype:
        for _, _, start, count in _row_chunks(entry):
            a = source.reader.read_bytes(entry, start, count)
            b = reader.read_bytes(pkg, start, count)
            if a != b:
                offset = next(i for i in range(count) if a[i] != b[i])
                return f"{name!r} ({pkg.path.name}) differs from the source copy at byte {start + offset}"
        return None
    if pkg.dtype == "F32" and entry.dtype in FLOAT_DTYPES:
        want = source.reader.read(entry).astype(np.float32)
        got = reader.read(pkg)
        if not np.array_equal(want, got, equal_nan=True):
            return f"{name!r} ({pkg.path.name}) is not the source {entry.dtype} values cast to F32"
        return None
    return f"{name!r} is {pkg.dtype} in the package but {entry.dtype} in the source"


@dataclass
class _Compared:
    """What comparing one source tensor with the package found."""

    source: list[str] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)
    reference_rows: int = 0  # rows the numpy reference re-derived (--exact)
    report: TensorReport | None = None
    skipped: list[str] = field(default_factory=list)


def _sample_bands(n: int, bn: int, fraction: float, seed: int, name: str) -> list[tuple[int, int]]:
    """Row ranges [r0, r1) to re-derive: every band of `bn` rows (a source tile row), or a seeded
    `fraction` of them, at least one, in every weight (so every layer and every module kind)."""
    bands = [(r0, min(n, r0 + bn)) for r0 in range(0, n, bn)]
    if fraction >= 1.0 or not bands:
        return bands
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    count = max(1, round(fraction * len(bands)))
    return [bands[i] for i in sorted(rng.choice(len(bands), size=count, replace=False))]


def _chunks(bands: list[tuple[int, int]], max_rows: int) -> Iterator[tuple[int, int]]:
    """Consecutive bands merged into row ranges of at most max_rows rows (at least one band)."""
    start = stop = None
    for r0, r1 in bands:
        if start is not None and r0 == stop and r1 - start <= max_rows:
            stop = r1
            continue
        if start is not None:
            yield start, stop
        start, stop = r0, r1
    if start is not None:
        yield start, stop


class _Rederive:
    """Re-derive a package weight from its source with the compiled kernels convert uses (bit-
    identical to the numpy reference) and compare bytes: every row, or `--sample` of the bands.
    The error against the resolved source is measured on STATS_ELEMENTS sampled elements per
    weight, among the rows re-derived (every row with --exact-full); --exact also re-derives
    sampled rows with the reference.
    """

    def __init__(
        self, lay: _Layout, source, options: VerifyOptions, rule: str | None, resolve_dtype: str, heads: set[str], notice
    ):
        self.lay, self.source, self.options = lay, source, options
        self.rule, self.resolve_dtype = rule, resolve_dtype
        self.fraction = 1.0 if options.exact == "full" else options.sample
        self.rows = 0  # rows re-derived with the kernels
        self.rows_of = 0  # rows of the weights compared
        self.relaid = 0  # MX source weights re-laid out, compared with their source bytes
        self._lock = threading.Lock()
        self._local = threading.local()
        from ascendconv import kernels

        self.kernels = kernels
        # the types the source's linears were written as (a module unquantized in the source
        # is labeled FLOAT too, but is compared as a copy and needs no kernel)
        kinds = {lay.modules[linear.prefix].label for linear in source.linears.values() if linear.prefix in lay.modules}
        # heads: the source tensors added copies are made from (one of a quantized weight is resolved)
        resolved = FLOAT in kinds or any(linear.weight.name in heads for linear in source.linears.values())
        needed = entry_points(source.linears.values(), bool(kinds & set(MX_TYPES)) and rule is not None, resolved)
        if kinds & set(MX_TYPES) and (options.exact == "full" or rule is None):
            needed.append("error")  # the error of every row
        kernels.compile_entry_points(needed, notice)

    def resolved_copy(self, reader: TensorReader, linear, name: str) -> str | None:
        """A tensor convert added from the weight of a quantized linear (an FP8 lm_head copied as the
        MTP drafter's head): that weight's values resolved to BF16, compared byte for byte."""
        pkg = self.lay.tensors[name]
        n, k = linear.shape
        if pkg.dtype != "BF16" or pkg.shape != (n, k):
            return (f"{name!r} is {pkg.dtype} {list(pkg.shape)} in the package; as the copy of the quantized "
                    f"{linear.weight.name!r} it holds that weight's BF16 values, [{n}, {k}]")
        rows_of = linear_rows(self.kernels, self.source, linear)
        rows_per_chunk = max(1, (CHUNK_BYTES // 4) // max(k, 1))
        for r0 in range(0, n, rows_per_chunk):
            rows = min(rows_per_chunk, n - r0)
            data = self.source.reader.read_bytes(linear.weight, r0 * rows_of.row_bytes, rows * rows_of.row_bytes)
            try:
                want = np.asarray(rows_of.to_bf16(data, r0, rows)).tobytes()
            except (NaNCodeError, NonFiniteValueError, NonFiniteScaleError, HeaderError) as exc:
                return exc.message
            got = bytes(reader.read_bytes(pkg, r0 * 2 * k, rows * 2 * k))
            if want != got:
                row = r0 + next(i for i in range(0, len(got), 2) if want[i : i + 2] != got[i : i + 2]) // (2 * k)
                return f"{name!r} ({pkg.path.name}) is not the BF16 values of {linear.weight.name!r}: row {row} differs"
        return None

    def linear(self, reader: TensorReader, linear, module: _Module) -> _Compared:
        """A source linear compared as its row operations say (sources/rows.py): in bands of tile
        rows, or every row from its values or its payload; which format it is, is theirs to know."""
        rows_of = linear_rows(self.kernels, self.source, linear)
        compare = {"tile bands": self.tiled_linear, "value rows": self.float_linear, "payload rows": self.mx_linear}
        return compare[rows_of.compared_as](reader, linear, module, rows_of)

    def tiled_linear(self, reader: TensorReader, linear, module: _Module, rows_of) -> _Compared:
        """A linear whose rows resolve with tile scales: sampled bands of tile rows (every band with
        --exact-full) re-derived with the kernels, the error measured on sampled rows."""
        out = _Compared()
        n, k = linear.shape
        name = linear.weight.name
        try:
            scale = rows_of.tile_scales()
        except (NonFiniteScaleError, HeaderError) as exc:  # NaN / Inf tile scales, a shard cut short
            out.source.append(exc.message)
            return out
        except OSError as exc:
            out.source.append(str(exc))
            return out
        band = rows_of.band_rows
        w = _Weight(name, module, scale, rows_of, QUANT_TYPES[module.label].element)
        derivable = module.label == FLOAT or self.rule is not None
        bands = _sample_bands(n, band, self.fraction, self.options.seed, name) if derivable else []
        full_stats = self.options.exact == "full" or not derivable  # nothing re-derived: measure every row
        reference_rows = (
            set(_sample_rows(n, self.options.exact_rows, self.options.seed, name).tolist())
            if self.options.exact == "sample" and derivable else set()
        )
        rows_per_chunk = max(band, (CHUNK_BYTES // 4) // max(k, 1) // band * band)
        read = bands if derivable else _sample_bands(n, band, 1.0, 0, name)
        # the error is measured on sampled rows of those read (the first, the last, random ones)
        candidates = np.concatenate([np.arange(a, b) for a, b in read])
        picks = _sample_rows(len(candidates), max(2, STATS_ELEMENTS // max(k, 1)), self.options.seed, name)
        stats_set = set(candidates[picks].tolist())
        acc = ErrorAccumulator()
        for r0, r1 in _chunks(read, rows_per_chunk):
            src_codes = _mapped_rows(self.source.reader, linear.weight, r0, r1)
            stored, codes, scales = _read_package_rows(reader, module, r0, r1)
            if derivable and any(a <= r0 < b for a, b in bands):
                problem = self._rederive(w, r0, src_codes, stored, scales)
                if problem:
                    out.source.append(problem)
                    return out
            if full_stats and w.fmt is not None:  # every row: summed by a kernel
                ref_sq, err_sq, max_abs, saturated = rows_of.error_sums(src_codes, scale, r0, self.resolve_dtype, w.fmt, stored, scales)
                acc.add_sums(ref_sq, err_sq, max_abs, (r1 - r0) * k, saturated)
            else:
                picked = [r - r0 for r in range(r0, r1) if full_stats or r in stats_set]
                self._measure(w, acc, np.array(picked, np.int64), r0, src_codes, codes, scales)
            for r in sorted(r for r in reference_rows if r0 <= r < r1):
                out.reference_rows += 1
                self._reference_row(w, r, src_codes[r - r0 : r - r0 + 1], stored, scales, r0)
        return self._finish(out, w, acc, n)

    def float_linear(self, reader: TensorReader, linear, module: _Module, rows_of) -> _Compared:
        """A linear quantized from float values: every row re-derived with the kernel (when the
        rule is known) and measured against the values themselves."""
        out = _Compared()
        n, k = linear.shape
        w = _Weight(linear.weight.name, module, None, rows_of, QUANT_TYPES[module.label].element)
        reference_rows = (
            set(_sample_rows(n, self.options.exact_rows, self.options.seed, w.name).tolist())
            if self.options.exact == "sample" and self.rule is not None else set()
        )
        acc = ErrorAccumulator()
        rows_per_chunk = max(1, (CHUNK_BYTES // 4) // max(k, 1))
        for r0 in range(0, n, rows_per_chunk):
            r1 = min(n, r0 + rows_per_chunk)
            values = rows_of.values(_mapped_rows(self.source.reader, linear.weight, r0, r1), r1 - r0)
            stored, codes, scales = _read_package_rows(reader, module, r0, r1)
            rows = np.arange(r0, r1)
            if self.rule is not None:
                try:
                    payload, scale_bytes = self.kernels.quantize_rows(values, w.fmt, self.rule)
                except ValueError:
                    out.source.append(f"source {w.name!r} holds NaN/Inf in rows {r0}..{r1 - 1}")
                    return out
                w.payload_diff.update(stored, payload, rows)
                w.scale_diff.update(scales, scale_bytes, rows)
                with self._lock:
                    self.rows += r1 - r0
            for r in sorted(r for r in reference_rows if r0 <= r < r1):
                out.reference_rows += 1
                payload, scale_bytes = requantize.quantize_rows(values[r - r0 : r - r0 + 1], w.fmt, self.rule)
                got = np.concatenate([stored[r - r0 : r - r0 + 1], scales[r - r0 : r - r0 + 1]], axis=1)
                w.reference_diff.update(got, np.concatenate([payload, scale_bytes], axis=1), np.array([r]))
            acc.update(values, _dequantize(module, codes, scales), codes, w.fmt)
        return self._finish(out, w, acc, n)

    def mx_linear(self, reader: TensorReader, linear, module: _Module, rows_of) -> _Compared:
        """A linear of an MX source, every row: re-laid out (the written type is the source's, or
        MXFP4 written W8A8_MXFP8), the package bytes compared with the source bytes through the
        named transform; re-quantized, re-derived from the decoded values with the kernel; written
        FLOAT, the BF16 of the decoded values. Each measured against the decoded values (a FLOAT one
        against their BF16, as a resolved FP8 weight is)."""
        import ml_dtypes

        out = _Compared()
        n, k = linear.shape
        fmt = QUANT_TYPES[module.label].element
        transform = transform_for(rows_of.fmt, fmt) if fmt is not None else None
        w = _Weight(linear.weight.name, module, None, rows_of, fmt)
        if transform is not None:
            w.payload_diff.what = f"payload (the source bytes through {transform!r})"
            w.scale_diff.what = "scale (the source's E8M0 bytes)"
        acc = ErrorAccumulator()
        rows_per_chunk = max(1, (CHUNK_BYTES // 4) // max(k, 1))
        try:
            for r0 in range(0, n, rows_per_chunk):
                r1 = min(n, r0 + rows_per_chunk)
                data = _mapped_rows(self.source.reader, linear.weight, r0, r1).view(np.uint8)
                stored, codes, scales = _read_package_rows(reader, module, r0, r1)
                rows = np.arange(r0, r1)
                values = rows_of.values(data, r1 - r0, r0)
                if transform is not None:
                    payload, scale_bytes = rows_of.relaid(data, r0, r1 - r0, transform)
                    w.payload_diff.update(stored, payload, rows)
                    w.scale_diff.update(scales, scale_bytes, rows)
                elif fmt is None:
                    want = values.astype(ml_dtypes.bfloat16)
                    w.payload_diff.update(stored.view(np.uint8), want.view(np.uint8), rows)
                    # measured as a resolved FP8 weight is, against its BF16 values: under E8M0
                    # bytes 0..2 MXFP8 holds values finer than BF16's subnormals
                    values = want.astype(np.float32)
                elif self.rule is not None:
                    payload, scale_bytes = self.kernels.quantize_rows(values, fmt, self.rule)
                    w.payload_diff.update(stored, payload, rows)
                    w.scale_diff.update(scales, scale_bytes, rows)
                    with self._lock:
                        self.rows += r1 - r0
                acc.update(values, _dequantize(module, codes, scales), codes if fmt is not None else None, fmt)
        except (NaNCodeError, NonFiniteValueError, NonFiniteScaleError) as exc:
            out.source.append(exc.message)
            return out
        if transform is not None:
            with self._lock:
                self.relaid += 1
        return self._finish(out, w, acc, n)

    def _finish(self, out: _Compared, w: "_Weight", acc: ErrorAccumulator, n: int) -> _Compared:
        """The differences and error of a weight compared in full, as its report."""
        module, name = w.module, w.name
        with self._lock:
            self.rows_of += n
        out.exact += [m for m in (w.payload_diff.message(), w.scale_diff.message()) if m]
        if not out.exact and w.reference_diff.message():  # the kernels agree with the package, not the reference
            out.exact.append(w.reference_diff.message())
        stats: ErrorStats = acc.result()
        threshold = self.options.min_sqnr(module.label)
        ok = stats.rel_l2 == 0.0 if module.label == FLOAT else stats.sqnr_db >= threshold  # False for NaN
        out.report = TensorReport(
            name, module.label, stats.rel_l2, stats.sqnr_db, stats.max_abs, stats.saturated_fraction, threshold, ok
        )
        return out

    def _rederive(self, w: "_Weight", r0: int, src_codes, stored, scales) -> str | None:
        """Compare rows [r0, r0 + len) of the package with the kernels' output; a broken source
        (NaN codes, values that overflow) is returned as a problem."""
        rows = np.arange(r0, r0 + len(src_codes))
        out = self._buffer(stored.nbytes).view(stored.dtype).reshape(stored.shape)
        try:
            payload, scale_bytes = w.rows.rederive(src_codes, w.scale, r0, w.fmt, self.rule, self.resolve_dtype, out=out)
            if w.fmt is None:
                w.payload_diff.update(stored.view(np.uint8), payload.view(np.uint8), rows)
            else:
                w.payload_diff.update(stored, payload, rows)
                w.scale_diff.update(scales, scale_bytes, rows)
        except ValueError:
            nan_at = w.rows.first_nan(src_codes)
            if nan_at:
                return f"source {w.name!r} holds a NaN code at row {r0 + nan_at[0]}, column {nan_at[1]}"
            return f"source {w.name!r} holds values that overflow in rows {r0}..{rows[-1]}"
        with self._lock:
            self.rows += len(rows)
        return None

    def _buffer(self, nbytes: int) -> np.ndarray:
        """This thread's output buffer for the kernels, kept across chunks: re-deriving into fresh
        memory would fault in as many new pages as the package is large."""
        held = getattr(self._local, "buffer", None)
        if held is None or held.nbytes < nbytes:
            held = self._local.buffer = np.empty(max(nbytes, CHUNK_BYTES), dtype=np.uint8)
        return held[:nbytes]

    def _measure(self, w: "_Weight", acc: ErrorAccumulator, picked: np.ndarray, r0: int, src_codes, codes, scales) -> None:
        """The error of the picked rows (indices into the block starting at r0), with numpy."""
        if not picked.size:
            return
        # each picked row resolved with its own row of tile scales
        reference = w.rows.resolved(src_codes[picked], w.scale, r0 + picked, "bf16" if w.fmt is None else self.resolve_dtype)
        approx = _dequantize(w.module, codes[picked], None if scales is None else scales[picked])
        acc.update(reference, approx, codes[picked] if w.fmt is not None else None, w.fmt)

    def _reference_row(self, w: "_Weight", r: int, src_row, stored, scales, r0: int) -> None:
        """Row r re-derived with the numpy reference (--exact), compared with the package."""
        i = r - r0
        payload, scale_bytes = w.rows.rederive(src_row, w.scale, r, w.fmt, self.rule, self.resolve_dtype, impl=requantize)
        if w.fmt is None:
            w.reference_diff.update(stored[i : i + 1].view(np.uint8), payload.view(np.uint8), np.array([r]))
            return
        got = np.concatenate([stored[i : i + 1], scales[i : i + 1]], axis=1)
        w.reference_diff.update(got, np.concatenate([payload, scale_bytes], axis=1), np.array([r]))


class _Weight:
    """One weight being compared: what re-deriving it needs, and the differences found."""

    def __init__(self, name: str, module: _Module, scale: np.ndarray | None, rows, fmt):
        # rows: the source rows' operations (sources/rows.py), scale: a tiled weight's tile scales
        self.name, self.module, self.scale, self.rows, self.fmt = name, module, scale, rows, fmt
        self.payload_diff = _Differences(name, "BF16 bytes" if fmt is None else "payload")
        self.scale_diff = _Differences(module.prefix + ".weight_scale", "scale")
        self.reference_diff = _Differences(name, "bytes (numpy reference)")


def check_source(found: _SourceFindings) -> Check:
    return make_check("source", found.source, "the package holds what the source implies; copies byte-identical")


def check_accuracy(found: _SourceFindings, options: VerifyOptions) -> Check:
    problems = []
    for t in found.tensors:
        if t.ok:
            continue
        if t.type == FLOAT:
            problems.append(f"{t.name!r} (FLOAT) is not the BF16-resolved source: rel. error {t.rel_err:.3g}")
        else:
            problems.append(
                f"{t.name!r} ({t.type}): SQNR {t.sqnr_db:.1f} dB < {t.min_sqnr_db:g} dB (rel. error {t.rel_err:.4f})"
            )
    measured_problems = bool(problems)
    problems += [f"not measured: {s}" for s in found.skipped]
    if not found.tensors and not problems:
        return skip_check("accuracy", "measured nothing: no weight of the package is in this source")
    mx_tensors = [t for t in found.tensors if t.type in MX_TYPES]
    detail = f"{plural(len(found.tensors), 'weight')} measured"
    if mx_tensors:
        worst = min(mx_tensors, key=lambda t: t.sqnr_db if not math.isnan(t.sqnr_db) else -math.inf)
        detail += f"; worst {worst.name} {worst.sqnr_db:.1f} dB"
    check = make_check("accuracy", problems, detail)
    if problems and not measured_problems:
        check.hint = STRUCTURAL_HINT
    return check


def check_exact(found: _SourceFindings, lay: _Layout, options: VerifyOptions) -> Check:
    prov = lay.pkg.record
    if prov.scale_rule not in SCALE_RULES:
        return make_check("exact", [f"no scale rule recorded in {PROVENANCE_NAME}: the bytes cannot be re-derived"], "")
    # nothing compared is no pass (the wrong source gives 0 rows)
    if not found.rows and not found.relaid and not found.exact:
        return skip_check("exact", "compared nothing: no weight of the package could be re-derived from this source")
    parts = []
    if found.rows:  # none where every weight is re-laid: then only the re-layout is said
        if options.exact == "full" or options.sample >= 1.0:
            what = f"every row ({plural(found.rows, 'row')})"
        else:
            what = (
                f"{found.rows} of {plural(found.rows_of, 'row')} (--sample {options.sample:g}, seed {options.seed}: that "
                "share of the tile rows of every weight, at least one)"
            )
        parts.append(
            f"{what} re-derived from the source with the compiled kernels equal the package bytes "
            f"(rule {prov.scale_rule}, resolve {prov.resolve_dtype})"
        )
        if options.exact == "sample":
            parts.append(f"{plural(found.exact_rows, 'sampled row')} ({options.exact_rows} per weight) equal the numpy reference")
    if found.relaid:
        same = "equals its" if found.relaid == 1 else "equal their"
        parts.append(f"{plural(found.relaid, 're-laid MX weight')} {same} source bytes through the named transform, every row")
    detail = "; ".join(parts)
    return make_check("exact", found.exact, detail)


# --- MoE: the GroupedMatmulSituQuant chain on sampled layers --------------------------------------
