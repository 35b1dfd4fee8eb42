"""The server package's shape: its face, and folders that import only downward."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import dsh_system_prompt_server

PACKAGE = Path(dsh_system_prompt_server.__file__).parent
# Lowest first, as the package's docstring lists them; inside rpc/, the Assemble RPC answered,
# then the streams' brokers, then the state both faces take, then the servicer. The package's
# root modules sit on top.
LAYERS = (
    "registry",
    "reports",
    "telemetry",
    "wire",
    "guard",
    "rpc",
    "rpc.assemble",
    "rpc.streams",
    "rpc.state",
    "rpc.service",
    "admin",
    "sidecar",
)


def _layer(module: str) -> int:
    """The rank of a module path inside the package: that of its longest listed prefix."""
    ranks = [rank for rank, layer in enumerate(LAYERS) if f"{module}.".startswith(f"{layer}.")]
    return max(ranks, default=len(LAYERS))


def _imports(path: Path) -> set[str]:
    """The package's modules a file imports, as paths relative to the package."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    package = here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            found.add(".".join((*base, *(node.module or "").split("."))).strip("."))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            PACKAGE.name + "."
        ):
            found.add((node.module or "")[len(PACKAGE.name) + 1 :])
    return found


def test_no_folder_imports_one_above_it() -> None:
    upward = [
        f"{path.relative_to(PACKAGE)} imports {target}"
        for path in PACKAGE.rglob("*.py")
        for target in _imports(path)
        if _layer(target) > _layer(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    ]
    assert upward == []


def test_the_admin_page_reads_the_state_not_the_servicer() -> None:
    servicer = [
        path.name for path in (PACKAGE / "admin").rglob("*.py") if "rpc.service" in _imports(path)
    ]
    assert servicer == []


def test_the_servicer_builds_nothing_but_its_own_fields() -> None:
    tree = ast.parse((PACKAGE / "rpc" / "service.py").read_text(encoding="utf-8"))
    init = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    parameters = {argument.arg for argument in init.args.args[1:]}
    assigned = [
        statement.value.id
        for statement in init.body
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Name)
    ]
    assert len(assigned) == len(init.body) and set(assigned) <= parameters, ast.unparse(init)


def test_the_top_level_holds_at_most_ten_modules_and_folders() -> None:
    # The eight rooms of LAYERS and the face with `__main__`: a ninth room needs a reason.
    entries = [
        p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    ]
    assert len(entries) <= 10, sorted(entries)


def test_every_folder_says_what_belongs_in_it() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), init


def test_the_face_names_the_sidecar_its_config_and_the_registry() -> None:
    from dsh_system_prompt_server import Registry, Sidecar, SidecarConfig, parse_config
    from dsh_system_prompt_server.registry import Registry as defined_registry
    from dsh_system_prompt_server.sidecar.app import Sidecar as defined_sidecar

    assert (Registry, Sidecar) == (defined_registry, defined_sidecar)
    assert parse_config({}) == SidecarConfig()


def test_importing_the_package_loads_none_of_the_server_extra() -> None:
    extra = ("grpc_health", "aiohttp", "prometheus_client")
    probe = f"import sys, dsh_system_prompt_server; print([m for m in {extra} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _module_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package at `root` (dotted, relative to it) and the package's
    modules it imports, at run time or for type checking alike."""
    paths = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix("__init__").strip("."): p
        for p in root.rglob("*.py")
        if "gen" not in p.relative_to(root).parts
    }
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = [part for part in package if part]
        graph[module] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package[: len(package) - (node.level - 1)]
            target = ".".join((*base, *filter(None, (node.module or "").split("."))))
            for alias in node.names:  # `from . import x` names a module, not the package
                named = f"{target}.{alias.name}".strip(".")
                graph[module].add(named if named in paths else target)
        graph[module].discard(module)
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of `graph` (the modules along it), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target, [*path, target])):
                return found
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return []


ROOT = PACKAGE.parent.parent
SOURCES = (PACKAGE, ROOT / "client" / "dsh_system_prompt", ROOT / "core" / "dsh_system_prompt_core")


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert [_circle(_module_graph(root)) for root in SOURCES] == [[], [], []]


def test_no_module_of_the_server_client_or_core_is_over_500_lines() -> None:
    long = [
        f"{path.relative_to(root.parent)}: {lines}"
        for root in SOURCES
        for path in root.rglob("*.py")
        if "gen" not in path.relative_to(root).parts
        and (lines := len(path.read_text(encoding="utf-8").splitlines())) > 500
    ]
    assert long == []


def test_no_import_renames_a_name_of_the_project() -> None:
    own = ("dsh_system_prompt", "dsh_system_prompt_core", "dsh_system_prompt_server")
    renamed = [
        f"{path.relative_to(root.parent)}:{node.lineno} {ast.unparse(node)}"
        for root in SOURCES
        for path in root.rglob("*.py")
        if "gen" not in path.relative_to(root).parts
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom)
        and (node.level or (node.module or "").split(".")[0] in own)
        and any(alias.asname for alias in node.names)
    ]
    assert renamed == []
