"""Project errors: each names what went wrong, where, and how to fix it.

The CLI maps an error to its exit code and prints `message` and `hint`; `--json` output carries the
class name as a stable error code. Library code raises these and never exits.
"""

from __future__ import annotations

import errno

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_ENVIRONMENT = 4  # this machine cannot do what was asked: write OUT, run on an NPU
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # the shell's 128 + SIGPIPE: the reader of stdout left (`| head`)

# Names, labels and values in messages come from files anyone can write; one of 16 MB would make
# every message (and its rendering) as large. Longer ones are cut in the middle, with their length.
MAX_SHOWN_CHARS = 300
MAX_MESSAGE_CHARS = 4000


def clip(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """`text` as it is, or its two ends around '…' and its length when longer than `limit`."""
    if len(text) <= limit:
        return text
    half = max(1, limit // 2 - 16)
    return f"{text[:half]}…{text[-half:]} ({len(text)} chars)"


def plural(n: int, word: str, words: str | None = None) -> str:
    """`n` and `word`, in the plural (`words`, else `word` + 's') unless `n` is 1: '1 module',
    '2 modules'; '1 entry', '2 entries'."""
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def shown(value: object) -> str:
    """repr(value) as a message shows a name, label or value read from a file: clipped, and bounded
    in time (a JSON value can hold an integer of thousands of digits, whose repr raises ValueError
    past Python's limit, or nest deeper than repr recurses)."""
    if isinstance(value, str):
        return clip(repr(value))
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxlong, shortener.maxlevel = 40, 3
    try:
        return clip(shortener.repr(value))
    except (ValueError, RecursionError):
        return f"<{type(value).__name__}>"


def json_shown(value: object) -> str:
    """A value read from a JSON file as the file spells it (a string as `shown` quotes it): its null
    is null, not Python's None. Clipped; a number past Python's digit limit is named by its type."""
    if isinstance(value, str):
        return shown(value)
    import json

    try:
        return clip(json.dumps(value, ensure_ascii=False))
    except (ValueError, RecursionError):
        return f"<{type(value).__name__}>"


def json_text(value: object) -> str:
    """A value read from JSON as a line of a report shows it: a string as it is, anything else as
    the file spells it (json_shown)."""
    return value if isinstance(value, str) else json_shown(value)


def json_kind(value: object) -> str:
    """A JSON value as a message names it: its type, and its value unless that is the type
    ('null', 'true', 'a number (3)', "a string ('x')", 'a list ([1])', 'an object ({})')."""
    if value is None or isinstance(value, bool):
        return json_shown(value)
    kinds = ((str, "a string"), ((int, float), "a number"), (list, "a list"))
    kind = next((name for types, name in kinds if isinstance(value, types)), "an object")
    return f"{kind} ({json_shown(value)})"


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised in the main thread so that cleanup runs; the exit code is
    the shell's 128 + signal number. `outcome` (set by whoever cleaned up) says what is left."""

    def __init__(self, signum: int = 2):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class AscendconvError(Exception):
    """Base of every error the tool reports to a user."""

    exit_code = EXIT_INPUT
    default_hint = ""

    def __init__(self, message: str, hint: str | None = None):
        message = clip(message, MAX_MESSAGE_CHARS)
        super().__init__(message)
        self.message = message
        self.hint = self.default_hint if hint is None else hint

    @property
    def code(self) -> str:
        return type(self).__name__

    def to_dict(self) -> dict:
        return {"error": self.code, "message": self.message, "hint": self.hint}


# --- usage (exit 2) ---------------------------------------------------------------------------


class UsageError(AscendconvError):
    exit_code = EXIT_USAGE


class OutputExistsError(UsageError):
    default_hint = "choose an empty or new directory, or pass --overwrite to replace it"


class BadOptionError(UsageError):
    pass


class UnsafeOutputError(UsageError):
    default_hint = "choose a new or empty directory outside the source"


class OutputBusyError(UsageError):
    default_hint = "wait for the other run to finish, or choose another OUT"


class OutputPathError(UsageError):
    default_hint = "choose another OUT: a new or empty directory in a writable directory"


class ResumeMismatchError(UsageError):
    default_hint = (
        "run again with the same source, options and ascendconv version to finish that work, "
        "or add --overwrite to discard it and start afresh"
    )


class RayMissingError(UsageError):
    default_hint = "install the extra: pip install 'ascendconv[ray]'"


# --- invalid or unreadable input (exit 3) -----------------------------------------------------


class InputError(AscendconvError):
    exit_code = EXIT_INPUT


class NotFoundError(InputError):
    pass


class NotCachedError(InputError):
    default_hint = "download it first (e.g. `hf download REPO`) or pass a local directory"


class UnrecognizedCheckpointError(InputError):
    default_hint = "pass a directory holding *.safetensors files and a config.json"


class UnsupportedSourceError(InputError):
    """A checkpoint in no format ascendconv reads (docs/sources.md lists them)."""

    default_hint = "ascendconv reads the source formats listed in docs/sources.md"


class InexactSourceError(UnsupportedSourceError):
    """A quantized format no AscendV1 type holds exactly (NVFP4, FP6): refused rather than
    re-quantized silently."""

    default_hint = "convert the model from its BF16 or FP8 release instead (docs/sources.md)"


class BlockedByTargetError(UnsupportedSourceError):
    """A source whose bytes would re-lay out exactly, but that vllm-ascend could not run as an
    AscendV1 package (gpt-oss: expert biases and swigluoai in an MX MoE layer)."""

    default_hint = "convert the model's BF16 release instead (docs/sources.md)"


class NotYetSupportedSourceError(UnsupportedSourceError):
    """A format that would re-lay out exactly but whose published layout is not confirmed
    (ModelOpt MXFP4): refused rather than read by a guess."""


class StaticActivationError(UnsupportedSourceError):
    """Activations quantized with static scales (a config saying so, or an `input_scale` tensor of a
    quantized linear), in whichever format."""

    default_hint = (
        "the MX types quantize activations dynamically; a static input_scale has no place in the package: "
        "convert a release with dynamic activations, or the BF16 master"
    )


class NoQuantizableLinearError(UnrecognizedCheckpointError):
    """A float checkpoint with nothing to quantize (no linear projection among its tensors)."""


class NotBlockFP8Error(UnsupportedSourceError):
    default_hint = (
        "ascendconv converts Hugging Face block-wise FP8 checkpoints "
        "(quant_method 'fp8' with weight_block_size and dynamic activations)"
    )


class UnreadableInputError(InputError):
    """A file or directory the command reads that this user may not read."""

    default_hint = "check its permissions (ls -ld), or run as a user who may read it"


class ConfigError(InputError):
    default_hint = "fix the file named (config.json, or the quantization config beside it), or download the checkpoint again"


class HeaderError(InputError):
    default_hint = "the file is corrupt or not a safetensors file; download it again"


class SourceChangedError(InputError):
    default_hint = "let whatever writes the checkpoint finish, then run again"


class TruncatedFileError(HeaderError):
    pass


class MissingShardError(InputError):
    default_hint = "the download is incomplete; fetch the missing shard"


class IndexMismatchError(InputError):
    default_hint = "the index and the shards disagree; download the checkpoint again"


class DuplicateTensorError(InputError):
    default_hint = "two files define the same tensor; remove the stray file"


class MissingScaleError(InputError):
    default_hint = "every F8_E4M3 weight needs its weight_scale_inv; the checkpoint is incomplete"


class OrphanScaleError(InputError):
    default_hint = "a weight_scale_inv has no F8_E4M3 weight beside it; the checkpoint is incomplete"


class ScaleShapeError(InputError):
    default_hint = "check weight_block_size in config.json against the scale tensors"


class ScaleDtypeError(InputError):
    default_hint = "the scale is not in a dtype its format stores; check that config.json names the checkpoint's format"


class NonFiniteScaleError(InputError):
    default_hint = "the scale tensor holds NaN or Inf; the checkpoint is corrupt"


class NaNCodeError(InputError):
    default_hint = "E4M3 codes 0x7F/0xFF are NaN; the checkpoint is corrupt"


class NonFiniteValueError(InputError):
    default_hint = "the tensor holds NaN or Inf; the checkpoint is corrupt"


class UnsupportedTensorError(InputError):
    pass


class IncompleteMoEError(InputError):
    default_hint = "the checkpoint is incomplete or its config.json disagrees with it; download it again"


class CopiedFileError(InputError):
    default_hint = (
        "a file the package carries from the source (config, tokenizer, code) must be a regular file: "
        "replace it with one, or remove it from the source"
    )


class ResumeLedgerError(InputError):
    default_hint = (
        "the kept work's ledger is not one ascendconv wrote: remove that staging directory, or pass "
        "--overwrite to discard it and start afresh"
    )


class PackageError(InputError):
    default_hint = "pass a directory written by `ascendconv convert`"


class PackageReplacedError(PackageError):
    """The package directory was replaced (or removed) while it was being read: what was read may
    come from two packages, so no check of it is reported."""

    default_hint = "run the command again once the run writing that output has finished"


class NotRegularFileError(HeaderError):
    default_hint = "replace it with the regular file it stands for (a FIFO or device is never read)"


# --- the environment cannot do what was asked (exit 4) ----------------------------------------


class EnvironmentProblem(AscendconvError):
    """Neither the input nor the options are at fault: this machine lacks what the run needs."""

    exit_code = EXIT_ENVIRONMENT


class NpuUnavailableError(EnvironmentProblem):
    default_hint = (
        "run on an Ascend 950 with torch_npu and vllm-ascend installed (pip install 'ascendconv[npu]'), "
        "or drop --on-npu"
    )


class RayUnreachableError(EnvironmentProblem):
    default_hint = "start the cluster (ray start --head), check --ray-address and the network, or drop it to run locally"


class RayCapacityError(EnvironmentProblem):
    default_hint = "lower --ray-cpus to what one node of the cluster has, or add nodes"


class OutOfMemoryError(EnvironmentProblem):
    default_hint = "free memory, raise the limit (ulimit -v), or use fewer --workers"


def out_of_memory(exc: MemoryError, doing: str) -> OutOfMemoryError:
    """A MemoryError (numpy's "Unable to allocate ..." included) as the named error, saying what
    ran out of memory: never a traceback, never taken for damaged input."""
    detail = str(exc).strip()
    return OutOfMemoryError(f"no memory left {doing}" + (f" ({clip(detail)})" if detail else ""))


def unreadable(exc: PermissionError) -> UnreadableInputError:
    """A PermissionError met while reading input, as the named error naming the path."""
    where = exc.filename if exc.filename is not None else "an input file"
    return UnreadableInputError(f"{clip(str(where))}: cannot be read ({exc.strerror or 'permission denied'})")


class FileSystemError(EnvironmentProblem):
    """An operating-system error no check foresaw (an I/O error of the disk, a file system that
    refuses an operation), named instead of ending in a traceback."""

    default_hint = "check the path and the disk it is on (dmesg for I/O errors), then run the command again"


def file_system_error(exc: OSError) -> FileSystemError | TooManyOpenFilesError:
    """An unforeseen OSError as the named error naming the path and the system's words."""
    where = " -> ".join(clip(str(f)) for f in (exc.filename, exc.filename2) if f is not None) or "a file"
    if exc.errno in OPEN_FILES_EXHAUSTED:
        return too_many_open_files(exc, where)
    return FileSystemError(f"{where}: {exc.strerror or exc}")


class TooManyOpenFilesError(EnvironmentProblem):
    """No file descriptor left (ulimit -n, or the system's table): the files are sound, and neither
    free space nor another download would help."""

    default_hint = "raise the open-file limit (ulimit -n 4096; the system's: sysctl fs.file-max), then run the command again"


class TooManyThreadsError(EnvironmentProblem):
    """A thread the run needs could not start: this user's count of processes and threads (ulimit -u)
    or the system's reached; an address space too small for its stack is OutOfMemoryError."""

    default_hint = "raise the limit (ulimit -u), or use fewer --workers"


OPEN_FILES_EXHAUSTED = (errno.EMFILE, errno.ENFILE)


def too_many_open_files(exc: OSError, where: object) -> TooManyOpenFilesError:
    """EMFILE or ENFILE met opening (or mapping) `where`, as the named error with this process's limit."""
    try:
        import resource

        limit = f"; this process may have {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} open (ulimit -n)"
    except (ImportError, OSError, ValueError):  # not POSIX
        limit = ""
    return TooManyOpenFilesError(f"{clip(str(where))}: cannot be opened: {exc.strerror or 'too many open files'}{limit}")


class StdoutWriteError(EnvironmentProblem):
    """stdout would not take the command's output (a full disk where it is redirected, an I/O
    error): said on stderr, as no JSON object can be written either."""

    default_hint = (
        "free space where stdout is redirected, or redirect it elsewhere; what the command did stands "
        "(a package it wrote is in place), only its output is lost"
    )


class OutputWriteError(EnvironmentProblem):
    default_hint = "free space, raise the file-size limit or choose another OUT; nothing was left at OUT"


class NoSpaceError(OutputWriteError):
    default_hint = "free space on that file system or choose an OUT on another one"


# --- parts and clusters (exit 3) ----------------------------------------------------------------


class PartDirectoryError(InputError):
    """A part directory (convert --part) given where a package or a source is expected."""


class PackageAsSourceError(InputError):
    default_hint = "inspect or verify it (`ascendconv verify PACKAGE`); to convert, pass the checkpoint it came from"


class PartError(InputError):
    default_hint = "pass the part directories written by `ascendconv convert SRC PARTDIR --part I/N`"


class MissingPartError(PartError):
    default_hint = "run the missing part (same SRC and options) and pass its directory too"


class DuplicatePartError(PartError):
    default_hint = "pass each part directory once"


class ForeignPartError(PartError):
    default_hint = "convert every part from the same source with the same options and ascendconv version"


class ShardChecksumError(PartError):
    default_hint = "the part was modified or damaged after it was written; run that part again"


class PartFailedError(AscendconvError):
    default_hint = "see the error above; fix its cause and run again (finished parts are not kept)"
