"""convert's and assemble's human output: what became what, the shards, the fallbacks, the totals."""

from __future__ import annotations

import dataclasses

from rich.console import Console
from rich.text import Text

from ascendconv.cli.console import terminal_safe
from ascendconv.cli.render.tables import deployment_flags, human_bytes, print_table, section, types_cell
from ascendconv.errors import plural


def print_warnings(warnings: list[str], err: Console) -> None:
    """Each warning on stderr, one line each (never wrapped: CI logs grep them), with or without
    --quiet: a quiet run is one with no table, not one that hides what may be wrong."""
    for warning in warnings:
        err.print(Text(f"warning: {terminal_safe(warning)}", style="yellow"), soft_wrap=True)


def render_convert(result, out: Console, err: Console, source: str = "SRC") -> None:
    """What became what (module groups), shards when planning, fallbacks, and the totals."""
    plan = result.plan
    head = "plan (dry run, nothing written)" if result.dry_run else f"wrote {terminal_safe(result.output)}"
    if result.part:
        head += f" (part {result.part[0]} of {result.part[1]}: {plural(len(result.shard_checksums), 'shard')})"
    out.print(Text(head, style="bold"))
    if result.reused_shards:
        out.print(f"resumed: {plural(len(result.reused_shards), 'finished shard')} reused, the rest converted")
    deployment = plan.deployment
    if deployment.tp > 1 or deployment.ep or deployment.shared_experts_as_routed or not deployment.mtp_heads:
        out.print(Text(f"planned for {deployment_flags(dataclasses.asdict(deployment))}"))
    print_warnings(plan.warnings, err)
    rows = [[terminal_safe(pattern), str(sum(types.values())), types_cell(types)] for pattern, types in plan.module_groups().items()]
    section(out, "source linears, by module (layer and expert numbers as *)")
    print_table(out, ["module", "n", "written as"], rows, right=(1,))
    conversions = plan.conversion_counts()
    if conversions["relaid"]:
        section(out, "MX payloads, by tensor: relaid (the source's bytes, lossless) or requantized")
        rows = [[terminal_safe(pattern), str(c["relaid"]), str(c["requantized"])] for pattern, c in plan.conversion_groups().items()]
        print_table(out, ["tensor", "relaid", "requantized"], rows, right=(1, 2))
    if result.dry_run:
        section(out, f"shards (limit {human_bytes(plan.max_shard_size) if plan.max_shard_size else 'none'})")
        rows = [[file, str(tensors), human_bytes(nbytes)] for file, tensors, nbytes in plan.shard_rows()]
        print_table(out, ["file", "tensors", "bytes"], rows, right=(1, 2))
    kept = plan.kept_float()
    if kept:
        section(out, "kept FLOAT by the model's rules")
        print_table(out, ["modules", "reason"], [[str(n), why] for why, n in kept.items()], right=(0,), wrap=1)
    if plan.added:
        section(out, "added FLOAT, for the MTP drafter (the release lacks them; --no-mtp-heads leaves them out)")
        rows = [[terminal_safe(added.name), terminal_safe(added.source), added.reason] for added in plan.added]
        print_table(out, ["tensor", "copy of", "why"], rows, wrap=2)
    if plan.fallbacks:
        section(out, f"{plural(len(plan.fallbacks), 'fallback')}")
        print_table(out, ["module", "n", "type", "reason"], fallback_rows(plan.fallbacks), right=(1,), wrap=3)
    counts = ", ".join(f"{n} {t}" for t, n in plan.tensor_counts().items() if n)
    bytes_out = plan.bytes_out if result.dry_run else result.bytes_written
    out.print()
    saving = f" ({(bytes_out - plan.bytes_in) / plan.bytes_in:+.0%})" if plan.bytes_in else ""
    out.print(
        f"{plan.scheme}, rule {plan.scale_rule}, resolve {plan.resolve_dtype}, kernel {result.kernel}: "
        f"{plural(sum(plan.tensor_counts().values()), 'tensor')} ({counts}"
        + (f"; MX payloads {conversions['relaid']} relaid, {conversions['requantized']} requantized" if conversions["relaid"] else "")
        + f"); {human_bytes(plan.bytes_in)} in, {human_bytes(bytes_out)} out{saving} "
        f"in {plural(plan.figures.shards, 'shard')}; {result.seconds:.2f} s",
        highlight=False,
    )
    _next_step(result, out, source)


def _next_step(result, out: Console, source: str) -> None:
    """What to run next: the conversion itself after a dry run, verify then vllm serve after one."""
    import shlex

    from ascendconv.package_files import serve_command

    if result.part:
        return  # the next step of a part is the last part's and assemble's business
    deployment = result.plan.deployment
    target = shlex.quote(str(result.output))
    if result.dry_run:
        out.print(Text("next: run the same command without --dry-run", style="dim"))
        return
    out.print(Text(f"next: ascendconv verify {target} --source {shlex.quote(source)}", style="dim"))
    out.print(Text("then: " + serve_command(deployment.tp, deployment.ep).replace("PACKAGE_DIR", target), style="dim"))


def fallback_rows(fallbacks) -> list[list[str]]:
    """One row per (module pattern, requested, written, reason with numbers as *, an --override as given)."""
    from ascendconv.decide import module_pattern
    from ascendconv.package_files import reason_pattern

    merged: dict[tuple, list] = {}
    for fb in fallbacks:
        merged.setdefault((module_pattern(fb.module), fb.requested, fb.written, reason_pattern(fb.reason)), []).append(fb)
    rows = []
    for (pattern, requested, written, reason), members in merged.items():
        one = len(members) == 1
        rows.append(
            [terminal_safe(members[0].module if one else pattern), str(len(members)), f"{requested}\n→ {written}",
             terminal_safe(members[0].reason if one else reason)]
        )
    return rows


def render_assemble(result, out: Console) -> None:
    out.print(
        f"wrote {result.output}: {plural(result.shards, 'shard')} from {plural(result.parts, 'part')} "
        f"({result.linked} linked, {result.shards - result.linked} copied), {human_bytes(result.bytes_written)} "
        f"in {result.seconds:.2f} s",
        highlight=False,
    )
