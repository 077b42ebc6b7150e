"""The import graph of the project is one-way and acyclic, with project imports at module top.

Every module of the four packages is parsed with ``ast`` (function-level and ``TYPE_CHECKING``
imports included), so a cycle or a wrong-way dependency fails here, by name, instead of hiding
behind an import inside a function until someone calls it.

Rules:

- ``osprey_data`` never imports ``osprey_train`` (the data layer knows nothing of training);
- nothing imports the CLI package (it is the top: it parses options and calls library ``run``s);
- the schemas package imports nothing of ours;
- project imports sit at module top, except in the CLI, where imports inside command functions
  keep torch off the ``--help`` path; third-party imports inside functions are only for the
  heavy or optional packages in ``LAZY_THIRD_PARTY``;
- at run time (``TYPE_CHECKING`` imports aside) no module imports itself through others, and
  neither does any subpackage (``osprey_data.store``, ``osprey_train.stages``, ...);
- old names stay gone: no module imports a renamed module (``osprey_data.target``, now
  ``osprey_data.target_model``), and no module outside the drafter registry
  (``osprey_train/drafters/``) switches on architecture names (``arch == ...``, ``== "eagle3"``).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# import name -> repository folder
PACKAGES = {"osprey_data": "osprey_data", "osprey_train": "osprey_train", "osprey_cli": "cli",
            "osprey_schemas": "schemas"}
# Third-party packages that may be imported inside functions: heavy to import (torch and what
# builds on it, matplotlib, datasets; jsonschema, which the schemas package loads only to
# validate) or optional extras (sglang and its kernels, flash-attn, s3fs) and engines living in venvs
# of their own (vllm).
LAZY_THIRD_PARTY = {"torch", "transformers", "sglang", "sgl_kernel", "flash_attn", "matplotlib", "datasets",
                    "accelerate", "gguf", "s3fs", "jsonschema", "vllm"}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    in_function: bool
    typing_only: bool


def _modules() -> dict[str, Path]:
    found = {}
    for name, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an import of ``name`` runs (the longest known prefix), if ours."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module, self.is_package = module, is_package
        self.depth, self.typing = 0, 0
        self.project: list[Edge] = []
        self.third_party_lazy: list[tuple[str, int]] = []

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            self.typing += 1
            for child in node.body:
                self.visit(child)
            self.typing -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def _record(self, name: str, line: int) -> None:
        target = _resolve(name)
        if target is not None:
            self.project.append(Edge(self.module, target, line, self.depth > 0, self.typing > 0))
        elif self.depth > 0 and name.split(".")[0] not in sys.stdlib_module_names:
            self.third_party_lazy.append((name, line))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._record(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.split(".")
            if not self.is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:  # `from pkg import submodule` imports the submodule
            full = f"{module}.{alias.name}"
            self._record(full if full in MODULES else module, node.lineno)


def _collect() -> tuple[list[Edge], dict[str, list[tuple[str, int]]]]:
    edges, lazy = [], {}
    for module, path in MODULES.items():
        collector = _Collector(module, path.name == "__init__.py")
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        edges += [e for e in collector.project if e.target != module]
        lazy[module] = collector.third_party_lazy
    return edges, lazy


EDGES, LAZY = _collect()


def _top(name: str) -> str:
    return name.split(".")[0]


def _subpackage(module: str) -> str:
    """The innermost package below the top level that holds ``module``: ``osprey_data.store.writer`` ->
    ``osprey_data.store``, ``osprey_train.drafters.osprey.model`` -> ``osprey_train.drafters.osprey``
    (an architecture's folder is a package of its own, apart from the registry beside it); a package
    stands for itself, and top-level modules stand alone."""
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES and MODULES[candidate].name == "__init__.py":
            return candidate
    return module


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _fmt(edges) -> str:
    return "\n".join(f"  {e.source}:{e.line} imports {e.target}" for e in edges)


def test_the_collector_sees_every_package():
    assert {_top(m) for m in MODULES} == set(PACKAGES)
    assert any(e.in_function for e in EDGES)            # the CLI's lazy imports are seen
    assert any(e.typing_only for e in EDGES)            # so are TYPE_CHECKING ones
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}}) is None


def test_data_never_imports_train_or_the_cli():
    bad = [e for e in EDGES if _top(e.source) == "osprey_data" and _top(e.target) in ("osprey_train", "osprey_cli")]
    assert not bad, "the data layer must not depend on training or the CLI:\n" + _fmt(bad)


def test_nothing_imports_the_cli():
    bad = [e for e in EDGES if _top(e.target) == "osprey_cli" and _top(e.source) != "osprey_cli"]
    assert not bad, "only the CLI imports the CLI:\n" + _fmt(bad)


def test_schemas_import_nothing_of_ours():
    bad = [e for e in EDGES if _top(e.source) == "osprey_schemas" and _top(e.target) != "osprey_schemas"]
    assert not bad, "osprey_schemas must stay free of project imports:\n" + _fmt(bad)


def test_project_imports_are_at_module_top_outside_the_cli():
    bad = [e for e in EDGES if e.in_function and _top(e.source) != "osprey_cli"]
    assert not bad, ("move these imports to the top of their module (an import cycle then fails at "
                     "once instead of hiding):\n" + _fmt(bad))


def test_lazy_third_party_imports_are_only_heavy_or_optional_packages():
    bad = [f"  {m}:{line} imports {name}" for m, found in LAZY.items() for name, line in found
           if _top(name) not in LAZY_THIRD_PARTY]
    assert not bad, "import these at module top:\n" + "\n".join(bad)


@pytest.mark.parametrize("level", ["module", "subpackage"])
def test_runtime_import_graph_is_acyclic(level):
    key = (lambda m: m) if level == "module" else _subpackage
    graph: dict[str, set[str]] = {}
    for e in EDGES:
        if e.typing_only:
            continue
        a, b = key(e.source), key(e.target)
        # A package's __init__ importing its own submodules is not a cycle of the package; at the
        # subpackage level a package and the packages nested in it are one subsystem.
        own_submodule = b.startswith(a + ".") and MODULES[a].name == "__init__.py"
        nested = b.startswith(a + ".") or a.startswith(b + ".")
        if a != b and not (own_submodule if level == "module" else nested):
            graph.setdefault(a, set()).add(b)
    cycle = _cycle(graph)
    assert cycle is None, f"import cycle at {level} level: {' -> '.join(cycle)}"


@pytest.mark.parametrize("args", [["--help"], ["data", "--help"], ["train", "--help"], ["eval", "--help"]])
def test_help_does_not_import_torch(args):
    code = ("import sys\nfrom osprey_cli.main import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'sglang', 'matplotlib') if m in sys.modules)\n"
            "print('HEAVY', heavy)" % (args,))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout, done.stdout[-500:]


# -- fences against old names coming back ------------------------------------------------------
# Renamed or replaced names: a module importing one of them fails here, with the new name.
RENAMED_MODULES = {"osprey_data.target": "osprey_data.target_model",
                   "osprey_train.evaluation.cpu_threads": "osprey_data.cpu_threads"}
# Architecture switches: the drafter registry (osprey_train/drafters/) is the one place that knows
# the architectures; everything else asks it (``drafter_spec(arch).needs_backbone`` and so on).
REGISTRY = ROOT / "osprey_train" / "drafters"
ARCH_SWITCH = re.compile(r"""\barch\b['"\]]*\s*==|(==|!=)\s*['"](osprey|eagle3)['"]|['"](osprey|eagle3)['"]\s*(==|!=)""")


def _imported_names(tree: ast.AST) -> list[tuple[str, int]]:
    """Absolute module names of every import (``from a import b`` gives ``a`` and ``a.b``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.module, node.lineno)] + [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
    return found


def _python_files() -> list[Path]:
    return [p for folder in (*PACKAGES.values(), "tests", "benchmarks") for p in sorted((ROOT / folder).rglob("*.py"))]


def test_no_module_imports_a_renamed_module():
    bad = [f"  {path.relative_to(ROOT)}:{line} imports {name} (now {new})"
           for path in _python_files()
           for name, line in _imported_names(ast.parse(path.read_text(encoding="utf-8")))
           for old, new in RENAMED_MODULES.items() if name == old or name.startswith(old + ".")]
    assert not bad, "renamed modules:\n" + "\n".join(bad)


def test_architecture_switches_live_in_the_registry_only():
    bad = [f"  {path.relative_to(ROOT)}:{i}: {line.strip()}"
           for folder in ("osprey_train", "cli") for path in sorted((ROOT / folder).rglob("*.py"))
           if REGISTRY not in path.parents
           for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if ARCH_SWITCH.search(line)]
    assert not bad, ("ask the drafter registry (osprey_train/drafters/registry.py: drafter_spec(arch)) instead of "
                     "testing architecture names:\n" + "\n".join(bad))


def test_the_registry_imports_arch_folders_only_through_their_torch_free_arch_modules():
    """The registry finds ``drafters/<name>/arch.py`` at run time (an import the graph above cannot see):
    those modules import only the spec and the error classes, so that hidden edge closes no cycle."""
    allowed = {"osprey_train.drafters.spec", "osprey_data.errors"}
    arch_modules = [m for m in MODULES if m.startswith("osprey_train.drafters.") and m.endswith(".arch")]
    assert {"osprey_train.drafters.osprey.arch", "osprey_train.drafters.eagle3.arch"} <= set(arch_modules)
    bad = [e for e in EDGES if e.source in arch_modules and e.target not in allowed]
    assert not bad, "an arch.py imports more than the spec and the errors:\n" + _fmt(bad)
    assert not [e for e in EDGES if e.source == "osprey_train.drafters.registry"
                and e.target.startswith("osprey_train.drafters.") and e.target != "osprey_train.drafters.spec"]


def test_the_fences_catch_what_they_are_for():
    assert _subpackage("osprey_train.drafters.osprey.model") == "osprey_train.drafters.osprey"
    assert _subpackage("osprey_train.drafters.registry") == "osprey_train.drafters"
    assert _subpackage("osprey_train.drafters.osprey") == "osprey_train.drafters.osprey"
    assert [n for n, _ in _imported_names(ast.parse("from osprey_data.target import TapLayers"))][0] == \
        "osprey_data.target"
    for line in ('if cfg.arch == "eagle3":', 'x = a if arm["arch"] == "osprey" else b', 'if "osprey" != kind:',
                 "if config.arch == name:"):
        assert ARCH_SWITCH.search(line), line
    for line in ('arch: str = "osprey"', 'ConvertConfig(arch="eagle3")', 'roles.get("osprey")',
                 "if config.arch != self.arch:", 'ROLES = ("osprey", "eagle3")'):
        assert not ARCH_SWITCH.search(line), line
