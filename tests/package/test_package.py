"""The server package's shape: its face, and folders that import only downward."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dsh_system_prompt_server

PACKAGE = Path(dsh_system_prompt_server.__file__).parent
# The one order of the sidecar's folders, lowest first: each imports only those before it (the
# package's docstring, every folder's and docs/architecture.md point here). Inside rpc/, the
# Assemble RPC answered, the streams' brokers, the state both faces take, the servicer. The
# package's root modules sit on top.
LAYERS = (
    "config",
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


def _dotted(path: Path) -> str:
    """A module's dotted path inside the package; a folder's face is the folder's path."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts).removesuffix("__init__").strip(".")


MODULES = {_dotted(path): path for path in PACKAGE.rglob("*.py")}
FOLDERS = {_dotted(init) for init in PACKAGE.rglob("__init__.py")} - {""}


def _imported(path: Path) -> Iterator[tuple[str, str]]:
    """(module, name) for each name a file imports from the package: the module it names it
    from, or (module, "") for a name that is a module (`from . import views`)."""
    package = [part for part in _dotted(path).split(".") if part]
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)]
            target = ".".join((*base, *filter(None, (node.module or "").split("."))))
        elif (node.module or "").split(".")[0] == PACKAGE.name:
            target = (node.module or "").removeprefix(PACKAGE.name).strip(".")
        else:
            continue
        for alias in node.names:
            named = f"{target}.{alias.name}".strip(".")
            yield (named, "") if named in MODULES else (target, alias.name)


def _defining(module: str, name: str) -> str:
    """The module defining `name`, followed from a face through the faces re-exporting it."""
    if module in FOLDERS and name:
        for source, imported in _imported(MODULES[module]):
            if imported == name:
                return _defining(source, name)
    return module


def _imports(path: Path) -> set[str]:
    """The package's modules a file takes names from (through a face, the defining one)."""
    return {_defining(module, name) for module, name in _imported(path)}


def _home(path: Path) -> str:
    """The folder a module belongs to: its own for a face."""
    module = _dotted(path)
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def test_no_folder_imports_one_above_it() -> None:
    upward = [
        f"{path.relative_to(PACKAGE)} imports {target}"
        for path in PACKAGE.rglob("*.py")
        for target in _imports(path)
        if _layer(target) > _layer(_dotted(path) or PACKAGE.name)
        # a face gathers its folder's names, those of its highest floor too
        and not (path.name == "__init__.py" and f"{target}.".startswith(f"{_home(path)}."))
    ]
    assert upward == []


def test_outside_a_folder_only_its_face_is_imported() -> None:
    # Inside a folder its modules import each other; from outside, what it offers is its
    # face (`__init__.py`), which may re-export its sub-folders' faces.
    reached = []
    for path in PACKAGE.rglob("*.py"):
        for target, _ in _imported(path):
            parts = target.split(".")
            outer = next(
                (
                    folder
                    for folder in (".".join(parts[:n]) for n in range(1, len(parts)))
                    if folder in FOLDERS and not f"{_home(path)}.".startswith(f"{folder}.")
                ),
                target,
            )
            if outer != target:
                reached.append(f"{path.relative_to(PACKAGE)} imports {target}, not {outer}")
    assert reached == []


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


def test_the_top_level_holds_at_most_eleven_modules_and_folders() -> None:
    # The nine rooms of LAYERS and the face with `__main__`: a tenth room needs a reason.
    entries = [
        p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    ]
    assert len(entries) <= 11, sorted(entries)


def test_every_folder_says_what_belongs_in_it() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert docstring, init
        # a folder LAYERS orders (and the package) points to it for the order, not a copy
        if _dotted(init) in {"", *LAYERS}:
            assert "`LAYERS` in tests/package/test_package.py" in " ".join(docstring.split()), init


def test_the_face_names_the_sidecar_its_config_and_the_registry() -> None:
    from dsh_system_prompt_server import Registry, Sidecar, SidecarConfig, parse_config
    from dsh_system_prompt_server.registry import Registry as defined_registry
    from dsh_system_prompt_server.sidecar.app import Sidecar as defined_sidecar

    assert (Registry, Sidecar) == (defined_registry, defined_sidecar)
    assert parse_config({}) == SidecarConfig()


def test_importing_the_package_loads_none_of_the_server_extra() -> None:
    # The package's face and the sidecar's load their names on first use: the command says
    # the extra is missing (sidecar/launcher.py) before any of it loads; the registry and the
    # reports are plain Python.
    extra = ("grpc_health", "aiohttp", "prometheus_client", "opentelemetry")
    faces = ", ".join(f"{PACKAGE.name}{face}" for face in ("", ".sidecar", ".registry", ".reports"))
    probe = f"import sys, {faces}; print([m for m in {extra} if m in sys.modules])"
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
