"""`ascendconv convert`: a source checkpoint in, an AscendV1 package out (or its plan)."""

from __future__ import annotations

import gc
from typing import Annotated, Callable, List, Optional

import typer

from ascendconv.cli import app, header_only_process, print_json, run
from ascendconv.cli.console import err, notice, out
from ascendconv.cli.options import (
    AsJson,
    Ep,
    KernelChoice,
    MtpHeads,
    NewPackage,
    Overwrite,
    Quiet,
    ResolveDtypeChoice,
    ScaleRuleChoice,
    SchemeChoice,
    SharedAsRouted,
    Tp,
    Workers,
    given,
    size_text,
)
from ascendconv.cli.progress import byte_progress
from ascendconv.formats.constants import ResolveDtype, ScaleRule
from ascendconv.options import (
    DEFAULT_RAY_CPUS_PER_TASK,
    DEFAULT_RAY_MAX_RETRIES,
    DEFAULT_RAY_PARTS,
    ConvertOptions,
    KernelName,
    RayOptions,
    parse_size,
)
from ascendconv.decide import Deployment, Scheme


@app.command()
def convert(
    src: Annotated[
        str, typer.Argument(metavar="SRC", help="Source checkpoint directory (or a repo id in the local HF cache).", parser=given)
    ],
    out_dir: NewPackage,
    scheme: SchemeChoice = Scheme(ConvertOptions.scheme),
    scale_rule: ScaleRuleChoice = ScaleRule(ConvertOptions.scale_rule),
    resolve_dtype: ResolveDtypeChoice = ResolveDtype(ConvertOptions.resolve_dtype),
    override: Annotated[
        Optional[List[str]], typer.Option(help="GLOB=TYPE on module names; repeatable, later wins.")
    ] = None,
    allow_unmatched_override: Annotated[
        bool,
        typer.Option("--allow-unmatched-override", help="Warn, instead of failing, when an --override glob matches no module."),
    ] = ConvertOptions.allow_unmatched_overrides,
    max_shard_size: Annotated[
        str, typer.Option(help="Shard size limit, e.g. 500MB, 2GiB; 0 for one file.")
    ] = size_text(ConvertOptions.max_shard_size),
    kernel: KernelChoice = KernelName(ConvertOptions.kernel),
    workers: Workers = ConvertOptions.workers,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan and write nothing.")] = False,
    as_json: AsJson = False,
    overwrite: Overwrite = ConvertOptions.overwrite,
    quiet: Quiet = False,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Keep finished shards if the run stops; reuse those an earlier --resume run kept."),
    ] = ConvertOptions.resume,
    part: Annotated[
        Optional[str],
        typer.Option(
            metavar="I/N", help="Write only part I of N into OUT (a part directory); join parts with `assemble`."
        ),
    ] = None,
    ray: Annotated[bool, typer.Option("--ray", help="Convert the parts as Ray tasks (local Ray, or --ray-address).")] = False,
    ray_address: Annotated[
        Optional[str], typer.Option(help="Ray cluster to join, e.g. auto or ray://head:10001 (implies --ray).")
    ] = None,
    # None when not given: without --ray they would be ignored, so they are refused
    ray_parts: Annotated[
        Optional[int],
        typer.Option(
            help=f"Parts under --ray; 0: one per task slot, at most one per shard.  [default: {DEFAULT_RAY_PARTS}]",
            show_default=False,
        ),
    ] = None,
    ray_cpus: Annotated[
        Optional[int],
        typer.Option(
            help=f"CPUs per Ray task (its conversion threads).  [default: {DEFAULT_RAY_CPUS_PER_TASK}]", show_default=False
        ),
    ] = None,
    ray_retries: Annotated[
        Optional[int],
        typer.Option(
            help=f"Retries of a failed Ray task; each reuses the shards it finished.  [default: {DEFAULT_RAY_MAX_RETRIES}]",
            show_default=False,
        ),
    ] = None,
    tp: Tp = Deployment.tp,
    ep: Ep = Deployment.ep,
    shared_experts_as_routed: SharedAsRouted = Deployment.shared_experts_as_routed,
    mtp_heads: MtpHeads = Deployment.mtp_heads,
) -> None:
    """Convert a checkpoint (FP8, MX or BF16; see `inspect`) into an AscendV1 MX package (the types per --scheme).

    --quiet prints no table, only warnings (on stderr); --json prints one object, warnings in it.
    """
    from ascendconv.cli.render.convert import print_warnings, render_convert
    from ascendconv.convert import convert as run_convert
    from ascendconv.errors import BadOptionError
    from ascendconv.io.hfcache import resolve_source
    from ascendconv.parts import parse_part

    # A one-shot process: every full collection would walk the objects numba and numpy created at
    # import, for nothing. Move them out of the collector's way (this also spares the final
    # collection at exit); a library caller keeps its own collector untouched.
    gc.freeze()
    if dry_run:
        header_only_process()

    def action():
        options = ConvertOptions(
            scheme=scheme.value,
            scale_rule=scale_rule.value,
            resolve_dtype=resolve_dtype.value,
            overrides=[parse_override(o) for o in override or []],
            max_shard_size=parse_shard_size(max_shard_size),
            kernel=kernel.value,
            workers=workers,
            overwrite=overwrite,
            resume=resume,
            part=parse_part(part) if part is not None else None,
            deployment=Deployment(tp, ep, shared_experts_as_routed, mtp_heads),
            allow_unmatched_overrides=allow_unmatched_override,
        )
        runner = run_convert
        given = {"parts": ray_parts, "cpus_per_task": ray_cpus, "max_retries": ray_retries}
        ray_given = {field: value for field, value in given.items() if value is not None}
        if ray or ray_address is not None:  # an empty --ray-address is refused, never a run without Ray
            runner = ray_runner(options, ray_address, ray_given, dry_run)
        elif ray_given:
            flags = [RAY_FLAGS[field] for field in ray_given]
            raise BadOptionError(
                f"{' and '.join(flags)} {'applies' if len(flags) == 1 else 'apply'} only under --ray",
                "add --ray (or --ray-address ADDRESS) to convert on Ray, or leave them out",
            )
        bar, progress, on_shard = byte_progress(quiet or dry_run, "converting")
        if bar is None:
            return runner(resolve_source(src), out_dir, options, progress, dry_run, notice, on_shard)
        with bar:
            return runner(resolve_source(src), out_dir, options, progress, dry_run, notice)

    result = run(action, as_json, "convert")
    if as_json:
        print_json(result, "convert")
    elif not quiet:
        render_convert(result, out, err, src)
    else:
        print_warnings(result.plan.warnings, err)


def parse_override(text: str):
    """--override GLOB=TYPE, with the type a user most likely meant when it is not one ('float')."""
    from ascendconv.ascendv1 import QUANT_TYPES
    from ascendconv.cli.envelope import closest
    from ascendconv.decide import Override
    from ascendconv.errors import BadOptionError

    try:
        return Override.parse(text)
    except BadOptionError as exc:
        glob, _, quant_type = text.rpartition("=")
        meant = closest(quant_type, QUANT_TYPES) if glob else None
        if meant is None:
            raise
        raise BadOptionError(exc.message, f"did you mean --override '{glob}={meant}'? ({exc.hint})") from None


def parse_shard_size(text: str) -> int:
    from ascendconv.errors import BadOptionError

    try:
        return parse_size(text)
    except BadOptionError as exc:
        raise BadOptionError(f"--max-shard-size: {exc.message}", exc.hint) from None


RAY_FLAGS = {"parts": "--ray-parts", "cpus_per_task": "--ray-cpus", "max_retries": "--ray-retries"}  # RayOptions' fields


def ray_runner(options: ConvertOptions, address: Optional[str], given: dict[str, int], dry_run: bool) -> Callable:
    """convert's stand-in under --ray: the same call, run as Ray tasks. A dry run checks the Ray
    options as the run would, then plans here: the plan is the same wherever it runs."""
    from ascendconv.cluster import convert_on_ray, import_ray
    from ascendconv.convert import convert as run_convert
    from ascendconv.errors import BadOptionError

    if options.part or options.resume:
        raise BadOptionError(
            "--ray runs every part itself and cannot be combined with --part or --resume",
            "under --ray a failed task is retried and reuses the shards it finished (--ray-retries)",
        )
    ray_options = RayOptions(address=address, **given)  # checked first; the fields not given keep their defaults
    if dry_run:
        return run_convert
    import_ray()  # fails at once, with how to install it
    return lambda src, out, options, progress, dry_run, notice, on_shard=None: convert_on_ray(
        src, out, options, ray_options, progress
    )
