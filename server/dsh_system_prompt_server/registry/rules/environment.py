"""The CEL environment rule expressions are compiled against, and one expression compiled and
evaluated with its failures in the rule's words.

The library (cel-expr-python, Google's cel-cpp bound for Python, in the server extra) is
imported on first use: a sidecar with no rule never loads it. The environment: `assembly`
(the proto's PromptAssembly), `fields` (map(string, dyn)), `scope` (string), `scope_chain`
(list(string)), the rule's `variables.NAME` typed as their expressions are, and inside a
mutation the item it judges (`tool`, `section` or `context`); CEL's standard library and
the strings extension. No clock, no randomness, no I/O: an expression's value is a function
of these. Each evaluation has the library's fixed budget of 10,000 comprehension iterations,
and each expression's worst-case cost is estimated when it compiles (cost.py).

A predicate is judged over all its items in one evaluation, the items given in lists of
`CHUNK` (`items_.map(c_, c_.map(tool, (...)))`): the library's map copies the list it builds
at every step, so one flat map over 1,024 items took about 78 ms here, chunked about 1 ms.
Between two evaluations the sidecar's other callers may have the loop (applied.py).
"""

from __future__ import annotations

import enum
import functools
import itertools
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .cost import CHUNK, Bound, Estimator, Sizes, TooComplex, fields_bound

# The proto package whose messages the environment declares.
_PACKAGE = "dsh.systemprompt.v1"
# What a mutation's predicate judges, by operation: the name it is bound to, and its message.
ITEMS = {"tool": "ToolSchema", "section": "AssembledSection", "context": "AssembledContext"}
# The list a predicate runs over, bound when a mutation runs (never in the user's environment).
ITEMS_LIST = "items_"
_CHUNK_NAME = "c_"
BUDGET = 10_000  # the library's comprehension iterations per evaluation (not configurable)


class Wanted(enum.Enum):
    """The type an expression must have where it is used (`dyn` is checked at run time)."""

    BOOL = "bool"
    STRING = "string"
    ANY = "any"


class CelRefusal(Exception):
    """An expression that does not compile; the message is CEL's, with `path` for <input>."""


class CelFailure(Exception):
    """An expression that failed at run time; the message says why."""


@functools.cache
def _library() -> tuple[Any, Any]:
    """The library and the descriptor pool holding the proto's messages (first use only)."""
    from cel_expr_python import cel
    from cel_expr_python.ext import ext_strings
    from dsh.systemprompt.v1 import system_prompt_pb2  # noqa: F401 (its messages join the pool)
    from google.protobuf import descriptor_pool

    return cel, (descriptor_pool.Default(), ext_strings.ExtStrings)


# Environments by their declarations, shared by the expressions compiled in them: one holds
# about 240 KB, an expression compiled in a shared one about 3 KB. A rule's variables make
# declarations of their own; the least recently used are let go (their expressions keep them).
_ENVIRONMENTS: OrderedDict[tuple[tuple[str, str], ...], Any] = OrderedDict()
_ENVIRONMENTS_KEPT = 64


def _environment(declared: Mapping[str, Any]) -> Any:
    key = tuple(sorted((name, type_.name()) for name, type_ in declared.items()))
    env = _ENVIRONMENTS.get(key)
    if env is not None:
        _ENVIRONMENTS.move_to_end(key)
        return env
    cel, (pool, strings) = _library()
    env = cel.NewEnv(pool, variables=dict(declared), extensions=[strings()])
    _ENVIRONMENTS[key] = env
    if len(_ENVIRONMENTS) > _ENVIRONMENTS_KEPT:
        _ENVIRONMENTS.popitem(last=False)
    return env


@functools.cache
def _bindings() -> Any:
    """The environment activations are made in: bindings are converted by their values,
    whatever environment an expression was compiled in."""
    cel, (pool, _) = _library()
    return cel.NewEnv(pool, variables={}, extensions=[])


def _base(cel: Any) -> dict[str, Any]:
    return {
        "assembly": cel.Type(f"{_PACKAGE}.PromptAssembly"),
        "fields": cel.Type.Map(cel.Type.STRING, cel.Type.DYN),
        "scope": cel.Type.STRING,
        "scope_chain": cel.Type.List(cel.Type.STRING),
        "variables": cel.Type.Map(cel.Type.STRING, cel.Type.DYN),
    }


@dataclass(frozen=True, slots=True)
class Program:
    """One compiled expression: where it is in its rule, what it reads, how it runs.

    `variables` are the rule's variables its source names (evaluated before it runs);
    `reads_assembly` says whether it needs `assembly` bound. A predicate is run over all the
    items at once (in lists of `CHUNK`, see the module's docstring), so a mutation is one
    evaluation and its iterations share one budget."""

    path: str
    source: str
    wanted: Wanted
    runnable: Any  # the library's compiled Expression
    type_: Any  # the library's Type of the expression's value
    variables: tuple[str, ...]
    reads_assembly: bool
    over_items: bool  # a predicate: its value is a list, one entry per item
    cost: int  # the worst case of one evaluation (of one item's, for a predicate), cost.py
    bound: Bound  # what its value holds at most


class Environment:
    """The declarations one rule's expressions are compiled against, the same for every rule
    (so that they share compiled environments: one holds about 240 KB), and the rule's
    variables declared so far (a variable sees those before it).

    `variables` is declared a map(string, dyn): a rule's variables would otherwise make an
    environment per rule. The names an expression reads from it are checked here instead
    (an undeclared one is refused with its position), and their values at run time."""

    def __init__(self, sizes: Sizes) -> None:
        self._cel = _library()[0]
        self._declared: dict[str, Any] = _base(self._cel)
        self._variables: list[str] = []
        from dsh.systemprompt.v1 import system_prompt_pb2 as pb

        self._pb = pb
        names = {
            "fields": fields_bound(sizes.fields_bytes),
            "scope": Bound(sizes.name_bytes),
            "scope_chain": Bound(sizes.name_bytes, items=Bound(sizes.name_bytes)),
        }
        self.estimator = Estimator(sizes, names)
        self.estimator.names["assembly"] = self.estimator.message(pb.PromptAssembly.DESCRIPTOR)

    def declare(self, name: str, bound: Bound) -> None:
        self._variables.append(name)
        self.estimator.variables[name] = bound

    def compile(self, path: str, source: str, wanted: Wanted, item: str | None = None) -> Program:
        """`source` compiled and type checked; CelRefusal with CEL's message (its position
        under `path`) when it does not compile or its type does not fit `wanted`."""
        cel = self._cel
        declared = dict(self._declared)
        if item is not None:
            declared[item] = cel.Type(f"{_PACKAGE}.{ITEMS[item]}")
        checked = self._compiled(declared, source, path)
        self._check_variables(path, source)
        type_ = checked.return_type()
        if not _fits(cel, type_, wanted):
            raise CelRefusal(
                f"{path}: wants a {wanted.value}, the expression is a {type_.name().lower()}"
            )
        descriptor = getattr(self._pb, ITEMS[item]).DESCRIPTOR if item is not None else None
        try:
            estimate = self.estimator.estimate(
                checked.serialize(), (item, descriptor) if item and descriptor else None
            )
        except TooComplex as error:
            raise CelRefusal(f"{path}: {error}: nest fewer comprehensions") from None
        runnable = checked
        if item is not None:  # one evaluation over the lists, one budget for the mutation
            declared[ITEMS_LIST] = cel.Type.List(cel.Type.List(declared.pop(item)))
            source_ = f"{ITEMS_LIST}.map({_CHUNK_NAME}, {_CHUNK_NAME}.map({item}, ({source})))"
            runnable = self._compiled(declared, source_, path)
        names = _references(source)
        return Program(
            path=path,
            source=source,
            wanted=wanted,
            runnable=runnable,
            type_=type_,
            variables=tuple(name for name in self._variables if f"variables.{name}" in names),
            reads_assembly="assembly" in names,
            over_items=item is not None,
            cost=estimate.cost,
            bound=estimate.bound,
        )

    def _check_variables(self, path: str, source: str) -> None:
        for found in _VARIABLE.finditer(_without_literals(source)):
            if found.group(1) not in self._variables:
                before = source[: found.start()]
                line, column = before.count("\n") + 1, found.start() - before.rfind("\n")
                raise CelRefusal(
                    f"{path}:{line}:{column}: undeclared reference to 'variables.{found.group(1)}'"
                    " (a rule's variables are declared before the expressions that read them)"
                )

    def _compiled(self, declared: Mapping[str, Any], source: str, path: str) -> Any:
        env = _environment(declared)
        try:
            return env.compile(source)
        except RuntimeError as error:
            raise CelRefusal(_located(str(error), path)) from None

    def activation(self, data: Mapping[str, Any]) -> Any:
        """Bindings for evaluations (an activation holds them converted once)."""
        return _bindings().Activation(dict(data))


def evaluate(program: Program, activation: Any) -> Any:
    """The expression's value as a Python value, checked against what it is wanted as; a
    CelFailure when it fails (an error value, the budget exhausted, a type that does not fit)."""
    cel = _library()[0]
    try:
        value = program.runnable.eval(activation)
    except RuntimeError as error:
        message = _status_removed(str(error))
        if "Iteration budget exceeded" in message:
            message = f"over the budget of {BUDGET:,} iterations of one evaluation"
        raise CelFailure(message) from None
    kind = value.type()
    if kind == cel.Type.ERROR:
        raise CelFailure(_status_removed(str(value.value())))
    plain = value.plain_value()
    if program.over_items:
        verdicts = list(itertools.chain.from_iterable(plain))
        if program.wanted is Wanted.BOOL and set(map(type, verdicts)) <= {bool}:
            return verdicts  # all fit (checked in C): the usual case
        return [_checked(each, program.wanted) for each in verdicts]
    return _checked(plain, program.wanted)


def _checked(value: Any, wanted: Wanted) -> Any:
    if wanted is Wanted.BOOL and not isinstance(value, bool):
        raise CelFailure(f"wants a bool, the value is {_type_word(value)}")
    if wanted is Wanted.STRING and not isinstance(value, str):
        raise CelFailure(f"wants a string, the value is {_type_word(value)}")
    return value


def _type_word(value: Any) -> str:
    words = {bool: "a bool", int: "an int", float: "a double", str: "a string", bytes: "bytes"}
    if value is None:
        return "null"
    for kind, word in words.items():
        if type(value) is kind:
            return word
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    return f"a {type(value).__name__}"


def _fits(cel: Any, type_: Any, wanted: Wanted) -> bool:
    if wanted is Wanted.ANY or type_ == cel.Type.DYN:
        return True
    return bool(type_ == (cel.Type.BOOL if wanted is Wanted.BOOL else cel.Type.STRING))


_STATUS = re.compile(r"^[A-Z_]+: ")
_STATUS_TAIL = re.compile(r" \[[A-Z_]+\]$")


def _status_removed(message: str) -> str:
    return _STATUS_TAIL.sub("", _STATUS.sub("", message.strip()))


def _located(message: str, path: str) -> str:
    """CEL's compile message with `path` where it says <input>, and without its status."""
    text = _status_removed(message).replace("ERROR: <input>:-1:-1:", f"{path}:")
    text = text.replace("ERROR: <input>:", f"{path}:").replace(" (in container '')", "")
    return text if text.startswith(path) else f"{path}: {text}"


# A CEL string literal (raw or not, single or triple quoted, bytes too): its names are no names.
_LITERAL = re.compile(
    r"""[rRbB]{0,2}('''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")""",
    re.DOTALL,
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)?")


_VARIABLE = re.compile(r"(?<![A-Za-z0-9_.])variables\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")


def _without_literals(source: str) -> str:
    """`source` with each string literal blanked, its length kept (positions stay)."""
    return _LITERAL.sub(lambda found: '"' + " " * (len(found.group()) - 2) + '"', source)


def _references(source: str) -> set[str]:
    """The names (and `variables.NAME` pairs) an expression's source mentions outside its
    string literals: what it may read, a little more than it does (never less)."""
    bare = _without_literals(source)
    names: set[str] = set()
    for found in _NAME.finditer(bare):
        start = found.start()
        if start and bare[start - 1] == ".":
            continue  # a field or method of something else, not a name of the environment
        text = re.sub(r"\s+", "", found.group())
        names.add(text)
        names.add(text.split(".")[0])
    return names


def chunked(items: list[Any]) -> list[list[Any]]:
    """A predicate's items as its evaluation takes them (see the module's docstring)."""
    return [items[start : start + CHUNK] for start in range(0, len(items), CHUNK)]
