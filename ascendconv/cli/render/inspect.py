"""inspect's human output: the summary of a checkpoint or a package, or its tensor list."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from ascendconv.cli.console import terminal_safe
from ascendconv.cli.render.convert import fallback_rows
from ascendconv.cli.render.tables import (
    MAX_LISTED,
    deployment_flags,
    elide_middle,
    fitted,
    human_bytes,
    print_grid,
    print_table,
    section,
    types_cell,
)
from ascendconv.errors import plural


UNKNOWN = "(unknown)"  # a description or provenance field the package's file holds no value of the right type for


def render_inspect(report, console: Console) -> None:
    """Print an InspectReport: the summary, or the tensor table when the report lists tensors."""
    if report.tensors is not None:
        _render_tensor_list(report, console)
    else:
        _render_inspect_summary(report, console)


def _print_head(report, console: Console) -> None:
    """The title (the directory's name or the repo id) and what the directory holds."""
    head = Text()
    head.append(terminal_safe(report.title), style="bold")
    head.append(f"  {report.label}")
    console.print(head)


def _render_inspect_summary(report, console: Console) -> None:
    from ascendconv.inspect import KIND_PLAIN

    _print_head(report, console)

    model = report.model
    facts = [
        ("path", str(report.path)),
        (
            "model",
            f"{model['model_type'] or '(no model_type)'}, {', '.join(model['architectures']) or '(no architectures)'}",
        ),
    ]
    if report.hub:
        facts.insert(1, ("revision", f"{report.hub['revision']} of {report.hub['repo_id']} in the Hugging Face cache"))
    quant = report.quantization
    if quant is not None and quant["quant_method"] is None:  # a plain float source
        facts.append(("format", f"{quant['label']}: {quant['fmt']} weights, quantized from their values"))
    elif quant is not None:
        tiles = quant["weight_block_size"]
        scales = "/".join(quant["scale_dtypes"]) or "no"
        tiling = f"block {tiles[0]}x{tiles[1]}" if tiles else "tiles " + "/".join(quant.get("strategies", []))
        if quant.get("encodings"):  # an MX-native source: groups of 32 along K, E8M0 scales
            tiling = "MX groups of 32 (" + "/".join(quant["encodings"]) + ")"
        text = f"{quant['label']}: {quant['quant_method']} {quant['fmt']}, {tiling}, {scales} scales"
        if quant["scale_fmt"]:
            text += f" ({quant['scale_fmt']})"
        text += f", {quant['activation_scheme']} activations"
        if quant["location"] != "quantization_config":
            text += f" (in {quant['location']})"
        facts.append(("quantization", text))
        skipped = quant["modules_to_not_convert"]
        listed = ", ".join(skipped[:MAX_LISTED]) + (f", … and {len(skipped) - MAX_LISTED} more" if len(skipped) > MAX_LISTED else "")
        facts.append(("unquantized", f"{len(skipped)}: {listed}" if skipped else "none listed"))
    package = report.package
    if package is not None:
        # null: the description holds no such field, which the disagreements name
        fields = {key: UNKNOWN if package[key] is None else package[key] for key in ("model_quant_type", "version", "group_size")}
        facts.append(
            (
                "model_quant_type",
                f"{fields['model_quant_type']} (version {fields['version']}, group_size {fields['group_size']})",
            )
        )
        prov = package["provenance"]
        if prov is None:
            facts.append(("provenance", "none (not written by ascendconv)"))
        else:
            # null: the file holds no value of the field's type, which the disagreements name
            said = {key: UNKNOWN if value is None else value for key, value in prov.items()}
            facts.append(("converted by", f"{said['tool']} {said['version']} from {said['source']}"))
            fallbacks = "fallbacks " + UNKNOWN if prov["fallbacks"] is None else plural(prov["fallbacks"], "fallback")
            facts.append(("scheme", f"{said['scheme']}, rule {said['scale_rule']}, resolve {said['resolve_dtype']}, {fallbacks}"))
            hub = prov["hub"]
            source = f"{hub['repo_id']} at revision {hub['revision']}" if hub else said["source"]
            facts.append(("source", source + (f", on {prov['date']}" if prov["date"] else "")))
            if prov["deployment"]:
                facts.append(("planned for", deployment_flags(prov["deployment"])))
            if prov["overrides"]:
                facts.append(("overrides", ", ".join(prov["overrides"])))
            if prov["command"]:
                facts.append(("command", prov["command"]))
    index = "with index" if report.index else "no index"
    facts.append(("files", f"{plural(len(report.shards), 'shard')}, {human_bytes(report.total_bytes)}, {index}"))
    text = f"{report.tensor_count} ({human_bytes(report.tensor_bytes)} of data)"
    if quant is not None:
        text += f", {plural(report.fp8_linears, 'quantizable linear')}"
    facts.append(("tensors", text))
    text = plural(report.layers, "layer")
    if model["num_hidden_layers"] is not None and model["num_hidden_layers"] != report.layers:
        text += f" ({model['num_hidden_layers']} in config)"
    if report.routed_experts:
        text += f", {plural(report.routed_experts, 'routed expert')} in {plural(report.moe_layers, 'MoE layer')}"
    else:
        text += ", no routed experts"
    if report.shared_expert_layers:
        text += f", shared experts in {report.shared_expert_layers}"
    if report.indexer_layers:
        text += f", indexers in {report.indexer_layers}"
    if report.mtp_layers:
        text += f", MTP: {', '.join(report.mtp_layers)}"
    facts.append(("structure", text))
    facts.append(("rules", report.family))
    if report.deployment is not None:
        deployment = report.deployment
        text = f"--tp {deployment['tp']}" + (" --ep" if deployment["ep"] else "")
        if deployment["shared_experts_as_routed"]:
            text += " --shared-experts-as-routed"
        if not deployment["mtp_heads"]:
            text += " --no-mtp-heads"
        facts.append(("planned for", text))
    if report.kind == KIND_PLAIN:
        facts.append(("convert", "not possible: no quantization_config and no linear projection to quantize"))
    label_width = max(cell_len(label) for label, _ in facts)
    if console.is_terminal:  # a name: elided, never wrapped
        facts = [(label, elide_middle(value, console.width - label_width - 2) if label == "path" else value)
                 for label, value in facts]
    print_grid(console, facts)
    for warning in report.warnings:
        console.print(Text(f"warning: {terminal_safe(warning)}", style="yellow"))

    for title, table, key in (("tensors by dtype", report.by_dtype, "dtype"), ("tensors by quant type", report.by_quant_type, "quant type")):
        section(console, title)
        rows = [[name, str(cb.tensors), human_bytes(cb.bytes)] for name, cb in table.items()]
        print_table(console, [key, "tensors", "bytes"], rows, right=(1, 2), elide=None)

    if report.schemes is not None:
        _render_scheme_estimates(report, console)
    if report.groups:
        section(console, "module groups (layer and expert numbers as *)")
        if report.schemes is not None:
            schemes = list(report.schemes)
            headers = ["module", "n", *schemes]
            rows = [[terminal_safe(g.pattern), str(g.modules), *(types_cell(g.schemes[s]) for s in schemes)] for g in report.groups]
        elif package is not None:
            headers = ["module", "n", "type", "dtype"]
            rows = [[terminal_safe(g.pattern), str(g.modules), types_cell(g.types), types_cell(g.dtypes)] for g in report.groups]
        else:
            headers = ["module", "n", "dtype"]
            rows = [[terminal_safe(g.pattern), str(g.modules), types_cell(g.dtypes)] for g in report.groups]
        print_table(console, headers, rows, right=(1,), lead=2)
    if report.schemes is not None:
        _render_fallbacks(report, console)
        _render_runtime(report, console)
    if package is not None:
        _render_package_files(report, console)


def _render_scheme_estimates(report, console: Console) -> None:
    from ascendconv.ascendv1 import QUANT_TYPES

    section(console, "what convert would write, per --scheme (default options)")
    estimates = list(report.schemes.values())
    rows = [[f"{t} modules", *(str(e.modules[t]) for e in estimates)] for t in QUANT_TYPES]
    rows.append(["fallbacks", *(str(len(e.fallbacks)) for e in estimates)])
    rows.append(["model_quant_type", *(e.model_quant_type for e in estimates)])
    rows.append(["tensor bytes", *(human_bytes(e.bytes_out) for e in estimates)])
    rows.append(["shards (4 GiB)", *(str(e.shards) for e in estimates)])
    headers = ["", *(e.scheme for e in estimates)]
    print_table(console, headers, rows, right=tuple(range(1, len(headers))), elide=None, lead=1)


def _render_fallbacks(report, console: Console) -> None:

    any_fallback = False
    for scheme, estimate in report.schemes.items():
        if not estimate.fallbacks:
            continue
        any_fallback = True
        section(console, f"fallbacks under {scheme}: {plural(len(estimate.fallbacks), 'module')}")
        rows = fallback_rows(estimate.fallbacks)
        print_table(console, ["module", "n", "type", "reason"], rows, right=(1,), wrap=3)
    if not any_fallback:
        console.print(Text("no fallbacks under any scheme", style="dim"))


def _render_runtime(report, console: Console) -> None:
    section(console, "what vllm-ascend will run, per --scheme")
    for scheme, estimate in report.schemes.items():
        console.print(Text(scheme, style="bold"))
        print_grid(console, [("  -", note) for note in estimate.runtime], gap=1, label_style=None)


def _render_package_files(report, console: Console) -> None:
    section(console, f"shards ({len(report.shards)})")
    listed = report.shards if len(report.shards) <= MAX_LISTED else report.shards[: MAX_LISTED - 1]
    rows = [[terminal_safe(s.file), "unreadable" if s.tensors is None else str(s.tensors), human_bytes(s.bytes)] for s in listed]
    if len(listed) < len(report.shards):
        rows.append([f"… and {len(report.shards) - len(listed)} more", "", ""])
    print_table(console, ["file", "tensors", "bytes"], rows, right=(1, 2))
    if report.problems:
        section(console, f"{plural(len(report.problems), 'disagreement')} (`ascendconv verify` checks everything)")
        print_grid(console, [("-", p) for p in report.problems[:MAX_LISTED]], gap=1, label_style=None, value_style="yellow")
        if len(report.problems) > MAX_LISTED:
            console.print(Text(f"… and {len(report.problems) - MAX_LISTED} more (see --json)", style="yellow"))
    else:
        console.print(Text("description, index and shards agree", style="dim"))


def _render_tensor_list(report, console: Console) -> None:
    numbers = {s.file: i + 1 for i, s in enumerate(report.shards)}
    _print_head(report, console)
    console.print(
        Text(
            f"{len(report.tensors)} of {plural(report.tensor_count, 'tensor')} match "
            + fitted(console, repr(report.tensor_filter), console.width // 2)
        )
    )
    rows = [
        [
            terminal_safe(t.name),
            t.dtype,
            "×".join(map(str, t.shape)) or "scalar",
            t.quant_type or "(undescribed)",
            str(numbers.get(t.shard, "?")),
            human_bytes(t.bytes),
        ]
        for t in report.tensors
    ]
    headers = ["name", "dtype", "shape", "quant type", "shard", "bytes"]
    print_table(console, headers, rows, right=(4, 5), gap=1)
    listed = list(numbers.items())
    if len(listed) > 3:
        console.print(Text(f"shards are numbered 1..{len(listed)} in name order:", style="dim"))
        listed = [listed[0], listed[-1]]
    for file, number in listed:
        label = f"shard {number} = "
        console.print(Text(label + fitted(console, terminal_safe(file), console.width - len(label)), style="dim"))
