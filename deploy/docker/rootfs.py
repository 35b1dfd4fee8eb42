"""The image's layers, cut out of the build stage (the Dockerfile runs this as root).

    python rootfs.py VENV OUT        e.g. python rootfs.py /opt/venv /rootfs

The final stage is distroless: no package manager, no perl, nothing of Debian but what runs.
Everything comes from the build stage's own files (its Debian packages, the venv installed
from the wheelhouse), so it needs no network. Three folders, one layer each, in this order:

- OUT/system: the interpreter the venv points at; its standard library but what a server
  never imports (STDLIB_DROPPED, DYNLOAD_DROPPED); every shared library the interpreter, the
  kept extension modules and the venv's link (their ldd closure, glibc's loader included);
  dash as /bin/sh with cat, touch, test, ls and find (TOOLS: the HEALTHCHECK and the entry
  point need a shell; an operator's `exec` and the image tests need the rest; under 1 MiB);
  the CA bundle and OpenSSL's config; /etc/passwd and /etc/group with uid 10001,
  /etc/nsswitch.conf, /etc/os-release; and a dpkg status entry per Debian package its files
  came from (distroless's /var/lib/dpkg/status.d/, so scanners see their versions).
- OUT/dependencies: the venv but the project (the server extra's third-party packages, which
  change only when pyproject's pins do).
- OUT/project: the project's own files (its wheel's RECORD, with their pycs) and its console
  script.

On the way, in the venv: extension modules lose their symbol tables (strip --strip-unneeded,
when binutils is here), and tests, .pyi stubs, C sources and pip's leftovers go. The standard
library and the venv are compiled to unchecked-hash pycs: never validated against a source's
mtime, so no stat per import and nothing stale whatever a registry does to times (on a
read-only root a stale pyc would be recompiled in memory at every start). Sources stay, so a
traceback in the sidecar's log shows its lines. Every path keeps its place and every symlink
met stays a symlink (/lib -> usr/lib), so the venv's interpreter link resolves.

Last, the layers are checked in a chroot: every module the project imports anywhere (lazy
imports included) that imports in the build stage imports there too, and `dsh-system-prompt
--help` runs. Prints what each part weighs.
"""

from __future__ import annotations

import ast
import compileall
import json
import os
import py_compile
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

PROJECT = "dsh_system_prompt"  # the distribution whose files make the top layer
UID = 10001  # the image's user (the manifests' runAsUser)
STDLIB = sysconfig.get_paths()["stdlib"]
DYNLOAD = os.path.join(STDLIB, "lib-dynload")
# The standard library's parts a server never imports (each a top-level name in STDLIB).
STDLIB_DROPPED = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "turtle.py",
    "lib2to3",
    "distutils",
    "ensurepip",
    "venv",
    "pydoc_data",
    "sitecustomize.py",  # Debian's hook for apport, which is not here
}
# Extension modules for tests, terminals and databases (prefixes of their file names): with
# them go libncursesw, libreadline, libdb, libsqlite3, libcrypt, and NIS's Kerberos and tirpc.
DYNLOAD_DROPPED = (
    "_test",
    "_ctypes_test",
    "_xxtestfuzz",
    "_xxsubinterpreters",
    "xxlimited",
    "_curses",
    "readline",
    "_dbm",
    "_gdbm",
    "nis",
    "_sqlite3",
    "_crypt",
    "ossaudiodev",
)
VENV_DROPPED_DIRS = {"tests", "__pycache__", "pip", "setuptools", "_distutils_hack"}
INSTALLERS = ("pip-", "setuptools-")  # their dist-info, should an uninstall leave it
VENV_DROPPED_SUFFIXES = (".pyi", ".c", ".h", ".pyx", ".pxd", ".pxi", ".cc", ".cpp")
TOOLS = ("cat", "touch", "test", "ls", "find")
OPENSSL_CONFIG = "/usr/lib/ssl/openssl.cnf"
LAYERS = ("system", "dependencies", "project")  # OUT's folders, the image's layers in order


class Tree:
    """A folder mirroring paths of this filesystem: place() copies a path to the same path
    inside it, owner, mode and times kept, each symlink met on the way recreated as a symlink
    and its target placed too when it is within `scope` (a target outside is another
    layer's)."""

    def __init__(self, root: Path, scope: str = "/") -> None:
        self.root = root
        self.scope = scope
        self.placed: set[str] = set()
        root.mkdir(parents=True)

    def inside(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def place(self, path: str) -> None:
        path = os.path.normpath(path)
        if path == "/" or path in self.placed:
            return
        self.placed.add(path)
        parent, name = os.path.split(path)
        self.place(parent)
        source = os.path.join(os.path.realpath(parent), name)
        target = self.inside(source)
        info = os.lstat(source)
        if stat.S_ISLNK(info.st_mode):
            link = os.readlink(source)
            if not target.is_symlink():
                target.symlink_to(link)
            linked_to = os.path.normpath(os.path.join(os.path.dirname(source), link))
            if linked_to == self.scope or linked_to.startswith(self.scope.rstrip("/") + "/"):
                self.place(linked_to)
            return
        if stat.S_ISDIR(info.st_mode):
            target.mkdir(exist_ok=True)
            shutil.copystat(source, target)
        else:
            shutil.copy2(source, target)
        os.chown(target, info.st_uid, info.st_gid)

    def place_tree(self, top: str, keep: Callable[[str], bool] = lambda _: True) -> None:
        """top and everything under it that keep(path) admits (a folder it refuses is
        skipped whole)."""
        self.place(top)
        for folder, dirs, files in os.walk(top):
            for name in list(dirs):
                path = os.path.join(folder, name)
                if not keep(path):
                    dirs.remove(name)
                elif os.path.islink(path):
                    self.place(path)
                    dirs.remove(name)
                else:
                    self.place(path)
            for name in files:
                path = os.path.join(folder, name)
                if keep(path):
                    self.place(path)

    def make_dir(self, path: str, mode: int = 0o755, owner: int = 0) -> None:
        """A folder of the image's own (placed as it is here when it is here)."""
        if os.path.isdir(path) and owner == 0:
            self.place(path)
            return
        parent = os.path.dirname(path)
        self.make_dir(parent)
        target = self.inside(os.path.join(os.path.realpath(parent), os.path.basename(path)))
        target.mkdir(exist_ok=True)
        target.chmod(mode)
        os.chown(target, owner, owner)

    def write(self, path: str, text: str) -> None:
        self.make_dir(os.path.dirname(path))
        self.inside(path).write_text(text)
        self.inside(path).chmod(0o644)


def is_elf(path: str) -> bool:
    with open(path, "rb") as file:
        return file.read(4) == b"\x7fELF"


def linked(elf: str) -> list[str]:
    """The libraries ldd resolves for one ELF file, the loader included; one not found
    stops the build."""
    ran = subprocess.run(["ldd", elf], capture_output=True, text=True, check=False)
    found = []
    for line in ran.stdout.splitlines():
        text = line.strip()
        if "not found" in text:
            raise SystemExit(f"rootfs: {elf} needs {text}")
        path = (text.split("=>", 1)[1] if "=>" in text else text).split("(", 1)[0].strip()
        if path.startswith("/"):
            found.append(path)
    return found


def project_roots(site: Path) -> set[str]:
    """The project's paths: the top folders of its modules, its dist-info and its console
    scripts, read from its wheel's RECORD."""
    (info,) = site.glob(f"{PROJECT}-*.dist-info")
    roots = {str(info)}
    for line in (info / "RECORD").read_text().splitlines():
        relative = line.rsplit(",", 2)[0]
        if relative.startswith(".."):  # a console script, in the venv's bin/
            roots.add(os.path.normpath(site / relative))
        else:
            roots.add(str(site / relative.split("/", 1)[0]))
    return roots


def slim_venv(venv: Path) -> int:
    """Removes what a running sidecar never reads and strips the extension modules; returns
    the bytes stripping saved."""
    for folder, dirs, files in os.walk(venv):
        for name in [d for d in dirs if d in VENV_DROPPED_DIRS or d.startswith(INSTALLERS)]:
            shutil.rmtree(os.path.join(folder, name))
            dirs.remove(name)
        for name in files:
            if name.endswith(VENV_DROPPED_SUFFIXES) or name == "Activate.ps1":
                os.remove(os.path.join(folder, name))
    strip = shutil.which("strip")
    if strip is None:
        print("rootfs: no strip here (binutils): the extension modules keep their symbols")
        return 0
    saved = 0
    for path in venv.rglob("*.so*"):
        if path.is_file() and not path.is_symlink() and is_elf(str(path)):
            before = path.stat().st_size
            subprocess.run([strip, "--strip-unneeded", str(path)], check=True)
            saved += before - path.stat().st_size
    return saved


def compile_all(folders: Iterable[str]) -> None:
    """Unchecked-hash pycs for every module kept, made by this interpreter (the image's)."""
    dropped = "|".join(re.escape(name) for name in sorted(STDLIB_DROPPED))
    for folder in folders:
        ok = compileall.compile_dir(
            folder,
            rx=re.compile(f"^{re.escape(STDLIB)}/({dropped})(/|$)"),
            quiet=1,
            force=True,
            workers=0,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        if not ok:
            raise SystemExit(f"rootfs: {folder} does not compile")


def stdlib_kept(path: str) -> bool:
    if os.path.relpath(path, STDLIB).split(os.sep, 1)[0] in STDLIB_DROPPED:
        return False
    name = os.path.basename(path)
    return not (os.path.dirname(path) == DYNLOAD and name.startswith(DYNLOAD_DROPPED))


def system(tree: Tree, venv: Path) -> None:
    """The interpreter, its kept standard library, the shell and tools, every library they
    and the venv's extension modules link, and /etc."""
    interpreter = os.path.realpath(venv / "bin" / "python")
    for link in (venv / "bin").iterdir():  # python -> /usr/bin/python3 -> python3.11
        if link.is_symlink():
            target = os.path.normpath(os.path.join(link.parent, os.readlink(link)))
            if not target.startswith(f"{venv}/"):
                tree.place(target)
    tree.place_tree(STDLIB, keep=stdlib_kept)
    tree.place("/bin/sh")
    elves = [interpreter, os.path.realpath("/bin/sh")]
    for tool in TOOLS:
        path = shutil.which(tool, path="/usr/bin:/bin")
        if path is None:
            raise SystemExit(f"rootfs: no {tool} in the build stage")
        tree.place(path)
        elves.append(path)
    elves += [path for path in tree.placed if path.endswith(".so") and os.path.isfile(path)]
    elves += [str(path) for path in venv.rglob("*.so*") if path.is_file() and is_elf(str(path))]
    libraries = {library for elf in elves if is_elf(elf) for library in linked(elf)}
    # glibc loads libgcc_s itself (dlopen) to unwind a thread that exits or is cancelled.
    libc = next(path for path in linked(interpreter) if "/libc.so" in path)
    if os.path.exists(Path(libc).with_name("libgcc_s.so.1")):
        libraries.add(str(Path(libc).with_name("libgcc_s.so.1")))
    for library in sorted(libraries):
        tree.place(library)
    etc(tree)


def etc(tree: Tree) -> None:
    tree.write(
        "/etc/passwd",
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"sidecar:x:{UID}:{UID}:sidecar:/nonexistent:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    )
    tree.write("/etc/group", f"root:x:0:\nsidecar:x:{UID}:\nnogroup:x:65534:\n")
    # Without it glibc asks DNS before /etc/hosts, even for localhost.
    tree.write("/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n")
    # /etc/mtab as Debian has it: a runtime that finds none writes one into the container.
    for path in ("/etc/os-release", "/etc/mtab", "/usr/lib/ssl/cert.pem", OPENSSL_CONFIG):
        if os.path.lexists(path):
            tree.place(path)
    for path, mode, owner in (
        ("/tmp", 0o1777, 0),
        ("/proc", 0o555, 0),
        ("/sys", 0o555, 0),
        ("/dev", 0o755, 0),
        ("/run", 0o755, 0),
        ("/run/dsp", 0o755, UID),  # the socket's folder, the only place the sidecar writes
        ("/etc/dsh-system-prompt", 0o755, 0),  # where the config is mounted
    ):
        tree.make_dir(path, mode, owner)


def dpkg_status(tree: Tree) -> list[str]:
    """A status entry per Debian package whose files the tree holds; the packages."""
    info = Path("/var/lib/dpkg/info")
    if not info.is_dir():
        return []
    owners: dict[str, str] = {}
    for listing in info.glob("*.list"):
        package = listing.name.removesuffix(".list").split(":")[0]
        for line in listing.read_text().splitlines():
            if line and os.path.isfile(line) and not os.path.islink(line):
                owners.setdefault(os.path.realpath(line), package)
    placed = {os.path.realpath(path) for path in tree.placed}
    packages = sorted({owners[path] for path in placed if path in owners})
    for package in packages:
        entry = subprocess.run(
            ["dpkg-query", "--status", package], capture_output=True, text=True, check=True
        ).stdout
        tree.write(f"/var/lib/dpkg/status.d/{package}", entry)
    return packages


IMPORTS = """
import importlib, json, sys
failed = []
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception as error:
        failed.append(f"{name}: {type(error).__name__}: {error}")
print(json.dumps(failed))
"""


def imported_by(roots: Iterable[str]) -> list[str]:
    """Every absolute module name the project's sources import, at any depth."""
    modules: set[str] = set()
    for root in roots:
        for path in Path(root).rglob("*.py") if os.path.isdir(root) else ():
            for node in ast.walk(ast.parse(path.read_bytes())):
                if isinstance(node, ast.Import):
                    modules.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules.add(node.module)
    return sorted(modules)


def check(out: Path, venv: Path, project: set[str]) -> None:
    """The two layers in a chroot import what the build stage imports of the project's
    imports (some are optional: the tokens extra, dev tools), and the command runs."""
    python = str(venv / "bin" / "python")
    modules = imported_by(project)
    here = subprocess.run(
        [python, "-c", IMPORTS, json.dumps(modules)], capture_output=True, text=True, check=True
    )
    missing_here = {line.split(":", 1)[0] for line in json.loads(here.stdout)}
    wanted = [name for name in modules if name not in missing_here]
    with tempfile.TemporaryDirectory(dir=out) as merged:
        for layer in LAYERS:
            subprocess.run(["cp", "-al", f"{out / layer}/.", merged], check=True)
        chroot = [shutil.which("chroot") or "/usr/sbin/chroot", merged]
        alone = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
        there = subprocess.run(
            [*chroot, python, "-c", IMPORTS, json.dumps(wanted)],
            capture_output=True,
            text=True,
            check=False,
            env=alone,
        )
        if there.returncode != 0 or json.loads(there.stdout):
            raise SystemExit(f"rootfs: the layers fail to import:\n{there.stdout}{there.stderr}")
        subprocess.run(
            [*chroot, str(venv / "bin" / "dsh-system-prompt"), "--help"],
            check=True,
            stdout=subprocess.DEVNULL,
            env=alone,
        )
    print(f"rootfs: {len(wanted)} modules the project imports import in the layers")


def weigh(root: Path) -> Counter[str]:
    """Bytes per part of a layer, for the table."""
    parts: Counter[str] = Counter()
    stdlib, dynload = STDLIB.lstrip("/"), DYNLOAD.lstrip("/")
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                continue
            relative = os.path.relpath(path, root)
            if relative.startswith("opt/venv"):
                kind = ".pyc" if name.endswith(".pyc") else ".so" if ".so" in name else ".py, data"
                part = f"venv {kind}"
            elif relative.startswith(dynload):
                part = "stdlib extension modules"
            elif relative.startswith(stdlib):
                part = "stdlib .pyc" if name.endswith(".pyc") else "stdlib .py and data"
            elif relative.startswith("usr/bin/python"):
                part = "interpreter"
            elif relative.startswith("usr/bin"):
                part = "shell and tools"
            elif ".so" in name:
                part = "shared libraries"
            else:
                part = "etc, certificates, dpkg status"
            parts[part] += os.lstat(path).st_size
    return parts


def main() -> int:
    venv, out = Path(sys.argv[1]), Path(sys.argv[2])
    where = {"base": str(venv), "platbase": str(venv)}
    site = Path(sysconfig.get_paths("venv", vars=where)["purelib"])
    saved = slim_venv(venv)
    project = project_roots(site)
    compile_all([STDLIB, str(venv)])
    system_tree = Tree(out / "system")
    system(system_tree, venv)
    packages = dpkg_status(system_tree)
    Tree(out / "dependencies", scope=str(venv)).place_tree(
        str(venv), keep=lambda path: path not in project
    )
    project_tree = Tree(out / "project", scope=str(venv))
    for path in sorted(project):
        project_tree.place_tree(path)
    check(out, venv, project)
    print(f"rootfs: stripping saved {saved / 2**20:.1f} MiB")
    print(f"rootfs: from {len(packages)} Debian packages: {' '.join(packages)}")
    for name in LAYERS:
        parts = weigh(out / name)
        print(f"rootfs: {name} {sum(parts.values()) / 2**20:.1f} MiB")
        for part, size in parts.most_common():
            print(f"rootfs:   {part:32} {size / 2**20:6.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
