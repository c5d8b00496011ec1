"""The floors of docs/ARCHITECTURE.md, enforced: every `ascendconv` import in the package, at module
level or inside a function, goes to the importing module's floor or below."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ascendconv"

# first path component under ascendconv/ -> floor (as listed in docs/ARCHITECTURE.md, "Layers")
FLOORS = {
    **dict.fromkeys(("__init__", "errors", "formats", "ascendv1", "families", "models", "gcpause", "markdown"), 1),
    **dict.fromkeys(("io", "kernels", "npu", "sources"), 2),
    **dict.fromkeys(("decide", "plan", "options", "parts", "resume"), 3),
    **dict.fromkeys(("convert", "pipeline", "package_files", "assemble", "cluster", "inspect", "verify"), 4),
    **dict.fromkeys(("cli", "__main__", "entry"), 5),
}


def floor_of(dotted: str) -> int:
    """Floor of a module named `ascendconv.x.y` (or `ascendconv` itself, the version: floor 1)."""
    parts = dotted.split(".")
    return FLOORS[parts[1]] if len(parts) > 1 else 1


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 2 else parts)


def imports_in(text: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every ascendconv import in `text`, a module of `package`."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base))
    return [(line, target) for line, target in found if target == "ascendconv" or target.startswith("ascendconv.")]


def imports_of(path: Path) -> list[tuple[int, str]]:
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    return imports_in(path.read_text(encoding="utf-8"), package)


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_floor():
    """A new top-level module must be placed on a floor (here and in ARCHITECTURE.md)."""
    assert {module_name(p).split(".")[1] for p in SOURCES if module_name(p) != "ascendconv"} <= FLOORS.keys()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_down_the_floors(path):
    own = floor_of(module_name(path))
    upward = [f"line {line}: {target} (floor {floor_of(target)})" for line, target in imports_of(path)
              if floor_of(target) > own]
    assert upward == [], f"{module_name(path)} (floor {own}) imports upward: {upward}"


def test_the_check_sees_an_upward_import():
    """The check above can fail: an io module importing the planner, even lazily, is caught."""
    text = "from . import files\nimport numpy\n\ndef f():\n    from ascendconv.plan import Planner\n"
    targets = imports_in(text, "ascendconv.io")
    assert targets == [(1, "ascendconv.io"), (5, "ascendconv.plan")]
    assert [floor_of(t) for _, t in targets] == [2, 3]
