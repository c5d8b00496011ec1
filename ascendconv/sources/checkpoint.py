"""A checkpoint directory as every source format sees it: config.json, the shards and their merged
headers, and the top-level files beside them. Nothing here knows a quantization format: the format
modules of this package read their own config keys and pair their own tensors (`open_source`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ascendconv.errors import (
    ConfigError,
    DuplicateTensorError,
    IndexMismatchError,
    MissingShardError,
    NotCachedError,
    NotFoundError,
    UnrecognizedCheckpointError,
    UnsupportedTensorError,
    shown,
)
from ascendconv.io.files import MAX_COPIED_BYTES, is_regular, is_text, is_within, read_json
from ascendconv.io.hfcache import cached_repo
from ascendconv.io.safetensors import SafetensorsHeader, TensorEntry, TensorReader, read_header

INDEX_NAME = "model.safetensors.index.json"


def expert_slices(
    entry: TensorEntry, experts: str, parts: tuple[tuple[str, int], ...], suffix: str, stored: dict[str, TensorEntry]
) -> dict[str, TensorEntry]:
    """A fused 3-D (or more) expert tensor [E, rows, ...] as one tensor per expert and part: expert
    e's `parts` ((projection, rows), in the order stored, e.g. gate rows then up rows) become
    `{experts}.{e}.{projection}{suffix}`, each a contiguous byte range of the stored tensor (so
    reading them in order stays sequential). A slice whose name one of the `stored` tensors has is
    refused: the one would silently replace the other."""
    count, rows = entry.shape[0], entry.shape[1]
    row_bytes = entry.nbytes // (count * rows) if count * rows else 0
    out: dict[str, TensorEntry] = {}
    offset = entry.offset
    for e in range(count):
        for projection, part_rows in parts:
            name = f"{experts}.{e}.{projection}{suffix}"
            if name in stored:
                raise UnsupportedTensorError(
                    f"{stored[name].path.name}: {shown(name)} is stored, and is also a slice of the fused {shown(entry.name)}",
                    "a checkpoint stores its experts fused or one by one, not both; remove one of them",
                )
            nbytes = part_rows * row_bytes
            out[name] = TensorEntry(name, entry.dtype, (part_rows, *entry.shape[2:]), entry.path, offset, nbytes)
            offset += nbytes
    return out


def find_quantization_config(config: dict) -> tuple[dict | None, str]:
    """config.json's quantization_config and where it sits (top level, or under text_config as
    vision-language wrappers put it)."""
    if isinstance(config.get("quantization_config"), dict):
        return config["quantization_config"], "quantization_config"
    text = config.get("text_config")
    if isinstance(text, dict) and isinstance(text.get("quantization_config"), dict):
        return text["quantization_config"], "text_config.quantization_config"
    return None, ""


def load_config(root: Path) -> tuple[dict, Path]:
    path = root / "config.json"
    if not os.path.lexists(path):
        raise UnrecognizedCheckpointError(f"{root}: no config.json")
    config = read_json(path, ConfigError)
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: not a JSON object", "fix or re-download config.json")
    text = config.get("text_config")
    for location, holder in (("quantization_config", config), ("text_config.quantization_config", text)):
        # else taken for no quantization_config at all, and the checkpoint for a plain float one
        quant = holder.get("quantization_config") if isinstance(holder, dict) else None
        if quant is not None and not isinstance(quant, dict):
            raise ConfigError(
                f"{path}: {location} is {shown(quant)} ({type(quant).__name__}), not a JSON object",
                "a quantization_config is an object naming its quant_method; fix config.json, or download it again",
            )
    return config, path


def discover_shards(root: Path, index_name: str = INDEX_NAME) -> tuple[list[Path], dict[str, str] | None]:
    """The weight files of a directory: from its index, a single file, or bare shards.

    Returns the shard paths (sorted) and the index's weight_map when there is an index.
    """
    index_path = root / index_name
    if os.path.lexists(index_path) and not is_regular(index_path):
        # taken for no index, the shards left would be converted as the whole checkpoint, whichever
        # the index names that are missing
        found = "is not a regular file" if os.path.exists(index_path) else "is a symbolic link to a file that does not exist"
        raise IndexMismatchError(
            f"{index_path} {found}: it names the shards, so a missing one cannot be told",
            "the download is incomplete; fetch the index (or remove it where the checkpoint has none)",
        )
    if os.path.lexists(index_path):
        index = read_json(index_path, IndexMismatchError)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise IndexMismatchError(f"{index_path}: cannot read the index (no weight_map object)")
        # each distinct file once (a full-scale index maps 100,000 tensors to a few dozen files); the
        # first tensor of a bad one is named
        try:
            files = set(weight_map.values())  # a value that is no string stays in it: none equals a string
        except TypeError:  # an array or an object
            files = None
        if files is None or not all(type(f) is str and _is_file_name(f) for f in files):
            for name, file in weight_map.items():
                if not isinstance(file, str) or not _is_file_name(file):
                    raise IndexMismatchError(
                        f"{index_path}: tensor {shown(name)} is mapped to {shown(file)}, not to a file name in {root}"
                    )
        names = sorted(files)
        for name in names:
            if not is_regular(root / name):
                users = sorted(t for t, f in weight_map.items() if f == name)
                found = "is not a regular file" if os.path.exists(root / name) else "is not"
                raise MissingShardError(
                    f"{index_path}: shard {shown(name)} is named for {len(users)} tensors "
                    f"(first: {shown(users[0])}) but {found} in {root}"
                )
        return [root / n for n in names], weight_map
    shards = sorted(root.glob("*.safetensors"))
    for shard in shards:
        # a dangling link (an unfinished download, a link farm whose file is gone), a FIFO: skipped,
        # it would leave its tensors silently out of the package
        if not is_regular(shard):
            found = "is not a regular file" if os.path.exists(shard) else "is a symbolic link to a file that does not exist"
            raise MissingShardError(f"{root}: shard {shown(shard.name)} {found}")
    return shards, None


def _is_file_name(file: str) -> bool:
    return file not in ("", ".", "..") and os.path.basename(file) == file


def merge_headers(
    headers: list[SafetensorsHeader], weight_map: dict[str, str] | None, index_path: Path
) -> dict[str, TensorEntry]:
    """One name -> entry map over all shards; duplicates and index disagreements are errors."""
    tensors: dict[str, TensorEntry] = {}
    for header in headers:
        count = len(tensors)
        tensors.update(header.tensors)  # at C speed; a name defined before shows as a count short
        if len(tensors) != count + len(header.tensors):
            earlier = headers[: headers.index(header)]
            name = next(n for n in header.tensors if any(n in h.tensors for h in earlier))
            first = next(h for h in earlier if name in h.tensors)
            raise DuplicateTensorError(
                f"tensor {shown(name)} is defined twice: in {first.path.name} and in {header.path.name}"
            )
    if weight_map is not None and not _index_agrees(headers, weight_map, len(tensors)):
        for name, file in weight_map.items():
            entry = tensors.get(name)
            if entry is None:
                raise IndexMismatchError(f"{index_path}: tensor {shown(name)} is mapped to {shown(file)} but no shard holds it")
            if entry.path.name != file:
                raise IndexMismatchError(
                    f"{index_path}: tensor {shown(name)} is mapped to {shown(file)} but is stored in {shown(entry.path.name)}"
                )
        extra = sorted(set(tensors) - set(weight_map))
        if extra:
            raise IndexMismatchError(
                f"{index_path}: tensor {shown(extra[0])} in {tensors[extra[0]].path.name} is missing from the index"
                + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            )
    return tensors


def _index_agrees(headers: list[SafetensorsHeader], weight_map: dict[str, str], count: int) -> bool:
    """Whether the index maps exactly the shards' `count` tensors, each to its own shard (then
    merge_headers has nothing to name). The index's names are grouped by the file it gives, in its
    own order, and each group is looked up in that shard's header: a small dict each, where looking
    every name up in the index (189,000 for Qwen3.5-397B) missed the processor's caches."""
    if len(weight_map) != count:
        return False
    named_in: dict[str, list[str]] = {header.path.name: [] for header in headers}
    try:
        for name, file in weight_map.items():
            named_in[file].append(name)
    except (KeyError, TypeError):  # a file that is no shard, or no file name at all
        return False
    # each group within its shard's names, and as many names in all as the shards hold: the same names
    return all(all(map(header.tensors.__contains__, named_in[header.path.name])) for header in headers)


def in_file_order(headers: list[SafetensorsHeader]) -> bool:
    """Whether the headers, in this order, list their tensors in (file name, offset) order already."""
    names = [h.path.name for h in headers]
    if names != sorted(names):
        return False
    for header in headers:
        offsets = [e.offset for e in header.tensors.values()]
        if offsets != sorted(offsets):
            return False
    return True


@dataclass
class Checkpoint:
    """config.json and every shard header of a directory (never tensor data); tensors in (file,
    offset) order, so that reading them in this order is sequential."""

    root: Path
    config: dict
    config_path: Path
    headers: list[SafetensorsHeader]
    tensors: dict[str, TensorEntry]
    reader: TensorReader = field(default_factory=TensorReader, repr=False)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "Checkpoint":
        root = Path(path)
        if not root.is_dir():
            raise NotFoundError(f"{root}: no such directory", "pass the checkpoint directory")
        config, config_path = load_config(root)
        return cls.with_config(root, config, config_path)

    @classmethod
    def with_config(cls, root: Path, config: dict, config_path: Path) -> "Checkpoint":
        """The shards of `root`, whose config has been read (and accepted by a format) already."""
        shard_paths, weight_map = discover_shards(root)
        if not shard_paths:
            raise UnrecognizedCheckpointError(f"{root}: no *.safetensors files")
        headers = [read_header(p) for p in shard_paths]
        tensors = merge_headers(headers, weight_map, root / INDEX_NAME)
        if not in_file_order(headers):  # merged in header order: sorted already when each header is
            tensors = dict(sorted(tensors.items(), key=lambda kv: (kv[1].path.name, kv[1].offset)))
        return cls(root, config, config_path, headers, tensors, TensorReader({h.path: h.stamp for h in headers}))

    def respell(self, renames: tuple[tuple[str, str], ...]) -> None:
        """Name the tensors as the package does: each (source spelling, package spelling) infix of
        the model family's `module_renames` replaced, in place, every entry still pointing at its
        stored bytes (so messages name the package's spelling beside the file). Two tensors that
        become one name are refused: the package could hold only one of them."""
        if not renames:
            return
        respelled: dict[str, TensorEntry] = {}
        spelled_from: dict[str, str] = {}  # package name -> the stored one
        for name, entry in self.tensors.items():
            new = name
            for old, package in renames:
                new = new.replace(old, package)
            if new in respelled:
                first = spelled_from[new]
                raise DuplicateTensorError(
                    f"{self.tensors[first].path.name}: tensor {shown(first)} and {entry.path.name}: tensor {shown(name)} "
                    f"are both {shown(new)} as the package spells it ("
                    + ", ".join(f"{old!r} as {package!r}" for old, package in renames)
                    + ", the spelling vllm-ascend looks up)",
                    "a checkpoint stores each module under one spelling; remove one of the two",
                )
            respelled[new] = entry if new == name else TensorEntry(new, entry.dtype, entry.shape, entry.path, entry.offset, entry.nbytes)
            spelled_from[new] = name
        self.tensors = respelled

    def companion_files(self) -> tuple[list[str], dict[str, str]]:
        """Top-level files that may be carried into the package, and the ones that may not, with why.

        Only regular files whose real path stays inside the source directory qualify, or inside the
        Hugging Face cache's blob store when the source is a cache snapshot (whose files link there),
        or that link to the file of their own name beside a shard's real file (a link farm of the
        checkpoint, `cp -rs` or `ln -s ckpt/* .`: the directory the weights are read from): a link
        to /proc/self/environ or a secret elsewhere must never end up in a package. A snapshot file
        whose blob is gone is NotCachedError: the download is incomplete.
        """
        real_root = Path(os.path.realpath(self.root))
        allowed = [real_root]
        snapshot = real_root.parent.name == "snapshots"
        if snapshot:
            allowed.append(real_root.parent.parent / "blobs")
        shard_dirs = {Path(os.path.realpath(header.path)).parent for header in self.headers}
        safe: list[str] = []
        refused: dict[str, str] = {}
        for path in sorted(self.root.iterdir()):
            if not path.is_symlink() and path.is_dir():
                continue
            real = Path(os.path.realpath(path))
            linked_beside_shards = real.name == path.name and real.parent in shard_dirs
            if not linked_beside_shards and not any(is_within(real, base) for base in allowed):
                refused[path.name] = f"it links outside the source directory (to {real})"
            elif not os.path.lexists(real):
                if snapshot:  # the cache lost its blob: a package without the file would pass for complete
                    repo = cached_repo(self.root)
                    again = f"hf download {repo[0]} --revision {repo[1]}" if repo else "hf download REPO --revision REV"
                    raise NotCachedError(
                        f"{path}: the Hugging Face cache holds no blob for it ({real} does not exist)",
                        f"the cache is damaged or a download was cut short: `{again}` fetches the missing file",
                    )
                refused[path.name] = f"it is a symbolic link to {real}, which does not exist"
            elif not real.is_file():
                refused[path.name] = "it is not a regular file"
            elif not is_text(path.name):  # the package's provenance (JSON, UTF-8) could not name it
                refused[path.name] = "its name is not UTF-8"
            elif (size := real.stat().st_size) > MAX_COPIED_BYTES:
                # no config, tokenizer or code file is this large: a weight or data file in a format
                # vLLM does not read (a .nemo archive, a .tar), carried nowhere
                refused[path.name] = f"{size:,} bytes, larger than any file the package carries ({MAX_COPIED_BYTES // 2**20} MiB)"
            else:
                safe.append(path.name)
        return safe, refused

    @property
    def total_bytes(self) -> int:
        return sum(h.file_size for h in self.headers)

    def close(self) -> None:
        self.reader.close()
