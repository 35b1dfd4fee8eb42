"""The server package's shape: its face, and folders that import only downward."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import dsh_system_prompt_server

PACKAGE = Path(dsh_system_prompt_server.__file__).parent
# Lowest first, as the package's docstring lists them; inside rpc/, the translation modules,
# then the streams' brokers, then the state both faces take, then the servicer. The package's
# root modules sit on top.
LAYERS = (
    "registry",
    "reports",
    "telemetry",
    "rpc",
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


def test_the_top_level_holds_at_most_eight_modules_and_folders() -> None:
    entries = [
        p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    ]
    assert len(entries) <= 8, sorted(entries)


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
