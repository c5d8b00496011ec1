"""Structural, integrity and numerical checks of an AscendV1 package (contract sections 3-5).

`verify(path, options, progress)` returns a `VerifyReport`: a list of named `Check`s (each with
every problem it found, the tensor or file it concerns, and what to do), per-tensor error figures
against the source, and the results of the MoE and NPU checks. Nothing here prints or exits; the
CLI renders the report and turns `report.ok` into the exit code.

The checks, in the order they run (names are stable: the JSON output and CI scripts use them):

- structure (always): files, config, description, headers, index, coverage, dtypes, shapes, pairs,
  alignment, packed_groups, scales, payload; `tp` with `tp > 1`;
- integrity: provenance, checksums (the BLAKE3, or for older packages sha256, of every shard against
  ascendconv_provenance.json, after its size), copies (the sha256 of every other file; with a source,
  the carried files against the source's);
- with a source: source (the package holds exactly what the source implies, copies are
  byte-identical), accuracy (per-tensor SQNR thresholds; FLOAT-resolved weights exact), exact (the
  package bytes re-derived with the numpy reference under the recorded rule), moe (the
  GroupedMatmulSituQuant chain run on sampled MoE layers with package and with source experts);
- npu: the fused op on an Ascend 950 against the CPU reference (needs no source).

Memory stays bounded: tensors are read in row chunks with positioned reads, never a whole shard;
a shard is hashed mapped (BLAKE3, every core) and its tensors are scanned only when its checksum
does not vouch for it (see `integrity._scan`).

The package: `options`, `report`, `checks` (the registry of names and hints), `layout` (the
package reader), and one module per family of checks: `structure`, `integrity`, `accuracy`, `moe`,
`npu`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path

from ascendconv.ascendv1 import RECORDED, UNREADABLE, Provenance
from ascendconv.decide import Deployment
from ascendconv.errors import InputError
from ascendconv.io.hfcache import local_directory
from ascendconv.io.package import Package, refuse_package_as_source, refuse_part_directory, unreplaced
from ascendconv.verify.checks import CHECKS
from ascendconv.verify.integrity import (
    _scan,
    check_checksums,
    check_copies,
    check_payload,
    check_provenance,
    check_scales,
)
from ascendconv.verify.layout import _Layout
from ascendconv.options import Notice, VerifyProgress as Progress, VerifyOptions
from ascendconv.verify.report import DEFAULT, GIVEN, Check, MoeReport, NpuReport, TensorReport, VerifyReport
from ascendconv.verify.structure import (
    check_alignment,
    check_config,
    check_coverage,
    check_description,
    check_dtypes,
    check_files,
    check_headers,
    check_index,
    check_packed_groups,
    check_pairs,
    check_shapes,
    check_tp,
    check_unknown_tp,
)

__all__ = [
    "CHECKS",
    "Check",
    "MoeReport",
    "NpuReport",
    "TensorReport",
    "VerifyOptions",
    "VerifyReport",
    "verify",
]


def verify(
    package: str | os.PathLike,
    options: VerifyOptions | None = None,
    progress: Progress | None = None,
    notice: Notice | None = None,
) -> VerifyReport:
    """Check a package; see the module docstring for the checks.

    Raises `BadOptionError` (exit 2) for inconsistent options and an `InputError` (exit 3) when the
    package or the source cannot be read at all (no directory, no description, unparsable JSON).
    Every problem of a readable package is a failed check in the report, never an exception; a
    file another process truncates or opens for writing while it is mapped is SourceChangedError.
    """
    from ascendconv.io.files import mapped_reads_guarded

    options = options or VerifyOptions()
    options.validate()
    root = local_directory(package, "verify")
    with unreplaced(root, "verified"), mapped_reads_guarded():  # neither a pass nor failed checks of a mix
        return _verify(root, options, progress, notice)


def _deployment(options: VerifyOptions, record: Provenance) -> tuple[VerifyOptions, dict]:
    """The options with the --tp / --ep checked filled in: each as given, else as recorded at
    conversion, else Deployment's default; and where each came from (VerifyReport.deployment)."""
    chosen, origins = {}, {}
    for key in ("tp", "ep"):
        given = getattr(options, key)
        state, value = record.deployment_value(key)
        if given is not None:
            chosen[key], origins[key] = given, GIVEN
        elif state == RECORDED:
            chosen[key], origins[key] = value, RECORDED
        else:
            chosen[key], origins[key] = getattr(Deployment, key), UNREADABLE if state == UNREADABLE else DEFAULT
    return dataclasses.replace(options, **chosen), {**chosen, "from": origins, "recorded": record.deployment}


def _verify(
    root: Path,
    options: VerifyOptions,
    progress: Progress | None,
    notice: Notice | None,
) -> VerifyReport:
    started = time.perf_counter()
    refuse_part_directory(root, "a package")
    pkg = Package.open(root)
    options, deployment = _deployment(options, pkg.record)
    source = None
    if options.source is not None:
        from ascendconv.sources import open_source

        try:
            source = open_source(options.source)
        except InputError:  # a package given as --source fails to open as one: say what it is instead
            refuse_package_as_source(
                Path(options.source),
                "--source takes the checkpoint the package was converted from: "
                "`ascendconv verify PACKAGE --source CHECKPOINT`",
            )
            raise
    try:
        lay = _Layout(pkg)
        if options.on_npu:
            from ascendconv.verify.npu import require_npu

            require_npu(lay)
        checks = [
            check_files(lay),
            check_config(lay),
            check_description(lay),
            check_headers(lay),
            check_index(lay),
            check_coverage(lay),
            check_dtypes(lay),
            check_shapes(lay),
            check_pairs(lay),
            check_alignment(lay),
            check_packed_groups(lay),
        ]
        findings = _scan(lay, options, progress)
        checks.append(check_scales(findings))
        checks.append(check_payload(findings))
        if options.tp > 1:
            checks.append(check_tp(lay, options.tp, options.ep))
        elif deployment["from"]["tp"] == UNREADABLE:  # the recorded --tp is unknown: not checked, never passed
            checks.append(check_unknown_tp(pkg.record.deployment_value("tp")[1]))
        checks.append(check_provenance(lay, source))
        if options.checksums:
            checks.append(check_checksums(lay, findings))
            checks.append(check_copies(lay, source))

        tensors: list[TensorReport] = []
        moe: list[MoeReport] = []
        if source is not None:
            # the families that read values (numpy, the reference, the operator) are imported when asked
            from ascendconv.verify.accuracy import _compare_source, check_accuracy, check_exact, check_source

            found = _compare_source(lay, source, options, progress, notice)
            checks.append(check_source(found))
            checks.append(check_accuracy(found, options))
            checks.append(check_exact(found, lay, options))
            tensors = sorted(found.tensors, key=lambda t: (-math.inf if math.isnan(t.sqnr_db) else t.sqnr_db, t.name))
            if options.moe_check:
                from ascendconv.verify.moe import _run_moe

                check, moe = _run_moe(lay, source, options, progress)
                checks.append(check)
        npu_reports: list[NpuReport] = []
        if options.on_npu:
            from ascendconv.verify.npu import _run_npu

            check, npu_reports = _run_npu(lay, options, progress)
            checks.append(check)
        return VerifyReport(
            pkg.root, checks, tensors, moe, npu_reports, pkg.provenance, options, time.perf_counter() - started,
            deployment,
        )
    finally:
        if source is not None:
            source.close()
