"""The design's dependency rules, checked on the package's own imports: every `import` and
`from ... import` of a tuneforge module, at module level or inside a function, type-only ones too.
A change that breaks a rule fails here with the offending import named."""

import ast
from pathlib import Path

import tuneforge

PACKAGE = Path(tuneforge.__file__).parent
LEAVES = {
    "errors",
    "packed",
    "hardware",
    "file_modes",
    "parallel_dims",
    "mesh_rules",
    "sequence_classifier",
}
"""Small modules of shared facts: anyone may import them; they import nothing of ours but each other."""
TRAINER_IMPORTS = {
    "parallel", "execution", "plan", "runs", "peft", "models", "data", "config", "doctor",
    "precision",
} | LEAVES  # fmt: skip
ALLOWED = {
    "errors": set(),
    "packed": set(),
    "hardware": set(),
    "file_modes": set(),
    "parallel_dims": set(),
    "mesh_rules": set(),
    "sequence_classifier": set(),
    "config": {"errors", "sequence_classifier"},  # a reward model's path is checked as a classifier
    "models": LEAVES,
    "data": {"config"} | LEAVES,
    "assets": LEAVES,
    "peft": {"models", "config"} | LEAVES,
    "precision": {"peft", "models", "config"} | LEAVES,
    "runs": {"models", "peft", "config"} | LEAVES,
    "plan": {"models", "data", "peft", "runs", "config", "precision"} | LEAVES,
    "parallel": {"plan", "models", "data", "peft", "config", "precision"} | LEAVES,
    "execution": {"plan", "models", "data", "peft", "config", "precision"} | LEAVES,
    "doctor": {"plan", "models", "data", "peft", "runs", "config", "precision"} | LEAVES,
    "slurm": {"runs", "config"} | LEAVES,
    "export": {"models", "peft", "runs", "config", "precision"} | LEAVES,
    "inference": {"models", "peft", "runs", "data", "config"} | LEAVES,
    "train": TRAINER_IMPORTS,
    "bench": TRAINER_IMPORTS | {"train"},
    "api": TRAINER_IMPORTS | {"train", "export", "inference", "slurm"},
    "cli": None,  # the command line may call anything
    "__main__": {"cli"},
    "__init__": {"config", "train", "plan"},  # the subpackages that are also functions
}
"""Folder (or top-level module) -> the folders it may import from; its own is always allowed."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported tuneforge module) for every import in `path`."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None or node.level:
                found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, target) for line, target in found if target.split(".")[0] == "tuneforge"]


def folder_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_folder_is_under_a_rule():
    assert {folder_of(name) for name in all_modules()} <= set(ALLOWED)


def test_imports_point_one_way():
    broken = []
    for name, path in all_modules().items():
        source = folder_of(name)
        allowed = ALLOWED[source]
        if allowed is None:
            continue
        for line, target in imports_of(path):
            destination = folder_of(target)
            if destination != source and destination not in allowed:
                broken.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {source} -> {target}")
    assert not broken, "imports against the design's rules:\n" + "\n".join(broken)


def test_no_module_imports_itself_back():
    """No cycle between modules, even through imports inside functions or for type checking:
    a cycle means two files share one idea, or a fact sits in the wrong one."""
    modules = all_modules()
    graph = {
        name: {target for _, target in imports_of(path) if target in modules and target != name}
        for name, path in modules.items()
    }
    for name in graph:  # `from tuneforge.x import name` may name a module of package x
        graph[name] |= {
            target.rpartition(".")[0]
            for _, target in imports_of(modules[name])
            if target not in modules and target.rpartition(".")[0] in modules
        } - {name, "tuneforge"}
    cycles, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_rules_can_fail():
    """A planner module that imports the trainer is caught."""
    bad = PACKAGE / "plan" / "_rule_probe.py"
    bad.write_text("from tuneforge.train.loop import Trainer\n")
    try:
        try:
            test_imports_point_one_way()
        except AssertionError as error:
            assert "plan -> tuneforge.train.loop" in str(error)
        else:
            raise AssertionError("a plan -> train import went unnoticed")
    finally:
        bad.unlink()


def test_test_modules_share_helpers_not_each_other():
    """Shared test code lives in tests/helpers.py, tests/cli_runs.py and fixtures; a test module
    imported by another would run its tests twice and tie unrelated files together."""
    tests = Path(__file__).resolve().parents[1]
    offending = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and module.rpartition(".")[2].startswith("test_"):
                offending.append(f"{path.relative_to(tests)}:{node.lineno}: {module}")
    assert not offending, "test modules importing test modules:\n" + "\n".join(offending)


def test_every_error_of_ours_is_a_tuneforge_error():
    """One hierarchy: the command line reports a `TuneforgeError` as the user's to fix (exit 2,
    no traceback); any other exception is an internal bug and keeps its traceback."""
    import importlib

    from tuneforge.errors import TuneforgeError

    classes = []
    for name, path in all_modules().items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                classes.append(getattr(importlib.import_module(name), node.name))
    assert len(classes) >= 8
    outside = [cls.__qualname__ for cls in classes if not issubclass(cls, TuneforgeError)]
    assert not outside, f"errors outside the hierarchy: {outside}"
