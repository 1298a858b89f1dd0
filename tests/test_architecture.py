"""The house plan (ARCHITECTURE.md, revision 2) as checks: a method is wired only through the registry (its name is
a literal nowhere outside its own package), imports run down the package map, and no module holds two jobs' worth of
lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "omnimed"
MAX_LINES = 600
#: papers whose method is not built yet: their names are reserved for their own package too
PAPERS = ("selfbiorag", "omnirag", "polyrag", "biomedsearch", "medsraf")
#: the top-level modules every package above data may use: config location, plugin loading, tracking (which
#: itself reads package versions from data.artifacts)
LEAVES = {"conf", "plugins", "tracking"}
#: package (or top-level module) -> the packages of ours it may import; bench, cli and the package root: anything
ALLOWED = {
    "data": set(),
    "models": {"data", *LEAVES},
    "knowledge": {"data", "models", *LEAVES},
    "generation": {"data", "models", *LEAVES},
    "training": {"data", "models", *LEAVES},
    "methods": {"data", "models", "knowledge", "generation", *LEAVES},
    "evaluation": {"data", "models", "knowledge", "generation", "methods", *LEAVES},
    "tables": {"data", "models", "knowledge", "generation", "methods", "evaluation", *LEAVES},
    "tracking": {"data"},
    "conf": set(),
    "plugins": set(),
}


def modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def package_of(path: Path) -> str:
    parts = path.relative_to(SRC).parts
    return parts[0].removesuffix(".py")


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, package of ours) for every import in the file, function-level ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "omnimed" and len(parts) > 1:
                out.append((node.lineno, parts[1]))
    return out


def test_imports_run_down_the_package_map():
    wrong = []
    for path in modules():
        src = package_of(path)
        if src not in ALLOWED:  # bench, cli, the package root: they may use everything
            continue
        for line, dst in imported(path):
            if dst != src and dst not in ALLOWED[src]:
                wrong.append(f"{path.relative_to(SRC)}:{line} imports omnimed.{dst}")
    assert not wrong, "imports against ARCHITECTURE.md's direction:\n" + "\n".join(wrong)


def method_packages() -> dict[str, Path]:
    """Method name -> the package that owns it (registered methods, and the papers still to be built)."""
    from omnimed.methods.registry import get_method, method_names

    owners = {name: SRC / "methods" / name for name in PAPERS}
    for name in method_names():
        module = get_method(name).__module__.split(".")
        owners[name] = SRC.joinpath(*module[1:3])
    return owners


def test_no_method_is_named_outside_its_own_package():
    owners = method_packages()
    found = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in owners
                    and owners[node.value] not in path.parents):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} names {node.value!r}")
    assert not found, "a method is wired by name outside its package:\n" + "\n".join(found)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_is_over_the_line_budget(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(SRC)} has {lines} lines: split it along its jobs"


def test_every_test_the_readme_cites_for_a_guarantee_exists():
    """The README's Reliability table names the test behind each guarantee: a renamed or deleted test must not
    leave a guarantee standing on nothing."""
    import re

    repo = SRC.parents[1]
    readme = (repo / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Reliability"):readme.index("## Measured")]
    cited = set(re.findall(r"\b(test_\w+)", section)) - {p.stem for p in (repo / "tests").glob("test_*.py")}
    defined = {m for p in (repo / "tests").glob("test_*.py")
               for m in re.findall(r"^def (test_\w+)", p.read_text(encoding="utf-8"), re.M)}
    assert cited and not cited - defined, f"the README cites tests that do not exist: {sorted(cited - defined)}"


def test_ci_runs_the_readme_commands_for_both_test_tiers():
    """CI must run what the README tells a user to run: the first tier's command as written there (``-m "not
    slow"``), then the second tier's (``-m slow``), so that the two together run every test."""
    import re

    repo = SRC.parents[1]
    readme = (repo / "README.md").read_text(encoding="utf-8")
    ci = (repo / ".ci" / "run").read_text(encoding="utf-8")
    first = re.search(r"Run the tests:\n\n```bash\n(.+)\n```", readme)
    assert first, "README: no 'Run the tests:' command block"
    assert first.group(1) in ci.splitlines() and first.group(1).endswith('-m "not slow"'), first.group(1)
    second = re.search(r"`(\.venv/bin/python -m pytest [^`]+ -m slow)`", readme)
    assert second and second.group(1) in ci.splitlines(), "README's second tier is not what .ci/run runs"
