"""A rule expression's worst-case cost, estimated at registration over bounded inputs (the
model is Kubernetes' CEL cost estimation with maxLength bounds): an expression whose estimate
is over `limits.max_rule_cost` is refused, so no admitted rule can hold the event loop for
long. The library's budget counts comprehension iterations, not their cost, and it holds the
GIL: an evaluation cannot be interrupted, only kept from being admitted.

The estimate walks the checked expression (the library's serialized `cel.expr.CheckedExpr`,
read here with a small wire reader) with a bound on the size of every value: a string's bytes,
a list's or map's entries, and what each entry holds. The inputs' bounds come from the
limits: `fields` hold at most `max_fields_bytes` of JSON in all (so their entries share that
total), the assembly's lists at most `max_rule_items` entries (an assembly with more fails the
rule at run time), its texts `max_text_bytes`, its names `max_name_bytes`, a tool's schema
`max_tool_schema_bytes`. A unit is about a nanosecond of this library's work on the host the
costs were measured on (2 cores of an AMD EPYC): one node evaluated about 40, one entry of a
list copied about 60 (a comprehension building a list copies it at every step: quadratic),
one byte scanned about 1, one byte built about 4, one byte of `replace`'s output about 40,
one entry of a list `in` looks through about 150, one item a predicate judges about 4,000.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

NODE = 40  # one node evaluated: a call, a select, a constant
COPY = 60  # one entry of a list copied (a list grows by copying; 43-150 ns measured)
SCAN = 1  # one byte read: compared, searched, matched, counted
BUILD = 4  # one byte of a new string
REPLACE = 40  # one byte of replace()'s output
SPLIT = 120  # one entry of split()'s output
IN_ENTRY = 150  # one entry of a list `in` looks through (12 ns a string, 120 an int)
ITEM = 4000  # one item of a predicate: converted, bound, judged, its verdict read back
BUDGET = 10_000  # the library's comprehension iterations of one evaluation
_CAP = 1 << 50  # estimates saturate here: past any limit, never overflowing into nonsense
# Nodes one estimate may visit: a comprehension's body is walked up to four times (once,
# even shares, lopsided), so nested ones cost 4**depth walks and 9 nested `fields.all` in 148
# bytes held the event loop over 12 s at registration.
WALK = 20_000


class TooComplex(Exception):
    """An expression whose estimate would visit more than `WALK` nodes."""


@dataclass(eq=False)
class Bound:
    """What a value holds at most: `size` bytes (a string) or entries (a list, a map), 1 for a
    scalar; `items` bounds each entry (a map's values, a list's items) and `keys` a map's keys.
    `shared`: the entries' sizes together are within `size` (JSON fields, one total)."""

    size: int
    items: Bound | None = None
    keys: Bound | None = None
    message: Descriptor | None = None
    shared: bool = False
    lookup: bool = False  # a map, known to be one: `in` looks its key up


SCALAR = Bound(1)


def entries(bound: Bound) -> int:
    """How many entries a list or map holds at most (JSON takes two bytes an entry, `0,`)."""
    return max(bound.size // 2, 1) if bound.shared else bound.size


def fields_bound(total: int) -> Bound:
    """`fields`, a map parsed from at most `total` bytes of JSON; its values strings, lists or
    maps within the same total."""
    value = Bound(total, shared=True)
    value.items = value
    value.keys = value
    return Bound(total, items=value, keys=value, shared=True, lookup=True)


@dataclass(frozen=True)
class Sizes:
    """The bounds the inputs are estimated with, from the limits."""

    fields_bytes: int
    items: int  # entries of each of the assembly's lists a rule sees
    text_bytes: int
    name_bytes: int
    schema_bytes: int


@dataclass
class Estimate:
    """An expression's worst-case cost in units, and the bound on its value."""

    cost: int
    bound: Bound


def _sat(value: float) -> int:
    return int(min(max(value, 0), _CAP))


def flat(bound: Bound, depth: int = 0) -> int:
    """Every byte (or scalar) a value can hold, entries included."""
    if bound.shared or bound.items is None or depth > 3:
        return bound.size
    inner = flat(bound.items, depth + 1) + (flat(bound.keys, depth + 1) if bound.keys else 0)
    return _sat(bound.size * max(inner, 1))


def join(a: Bound, b: Bound, depth: int = 0) -> Bound:
    """A bound holding both."""
    if a is b:
        return a
    if depth > 3:
        return a if a.size >= b.size else b
    items = a.items if b.items is None else b.items if a.items is None else None
    if a.items is not None and b.items is not None:
        items = join(a.items, b.items, depth + 1)
    keys = a.keys if b.keys is None else b.keys if a.keys is None else None
    if a.keys is not None and b.keys is not None:
        keys = join(a.keys, b.keys, depth + 1)
    message = a.message if a.message is b.message else None
    return Bound(max(a.size, b.size), items, keys, message, a.shared and b.shared)


# --- the checked expression, read from its wire bytes -----------------------------------------


def _fields(data: bytes) -> dict[int, list[Any]]:
    """A protobuf message's fields by number (varints as ints, the rest as bytes)."""
    out: dict[int, list[Any]] = {}
    i, end = 0, len(data)
    while i < end:
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = data[i : i + 8], i + 8
        elif wire == 2:
            length, i = _varint(data, i)
            value, i = data[i : i + length], i + length
        elif wire == 5:
            value, i = data[i : i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7


def _one(fields: dict[int, list[Any]], number: int, default: Any = b"") -> Any:
    values = fields.get(number)
    return values[-1] if values else default


def _text(fields: dict[int, list[Any]], number: int) -> str:
    return bytes(_one(fields, number)).decode()


@dataclass
class _Checked:
    expr: bytes
    overloads: dict[int, list[str]] = field(default_factory=dict)


def _checked(serialized: bytes) -> _Checked:
    """The `cel.expr.CheckedExpr` the library serializes (in a google.protobuf.Any)."""
    outer = _fields(serialized)
    checked = _fields(_one(outer, 2)) if 1 in outer else outer
    overloads: dict[int, list[str]] = {}
    for entry in checked.get(2, []):  # reference_map: expression id -> Reference
        pair = _fields(entry)
        reference = _fields(_one(pair, 2))
        overloads[_one(pair, 1, 0)] = [bytes(o).decode() for o in reference.get(3, [])]
    return _Checked(_one(checked, 4), overloads)


# --- the walk ----------------------------------------------------------------------------------

Scope = Mapping[str, Bound]


class Estimator:
    """Estimates expressions compiled in one rule: `names` bounds the environment's names,
    `variables` the rule's variables estimated so far."""

    def __init__(self, sizes: Sizes, names: Mapping[str, Bound]) -> None:
        self.sizes = sizes
        self.names = dict(names)
        self.variables: dict[str, Bound] = {}
        self._checked: _Checked = _Checked(b"")
        self._walked = 0  # nodes visited by the estimate under way

    def string_field(self, name: str) -> Bound:
        sizes = self.sizes
        if name == "name":
            return Bound(sizes.name_bytes)
        if name in ("description", "parameters_json"):
            return Bound(sizes.schema_bytes)
        return Bound(sizes.text_bytes)

    def message(self, descriptor: Descriptor) -> Bound:
        return Bound(1, message=descriptor)

    def estimate(self, serialized: bytes, item: tuple[str, Descriptor] | None = None) -> Estimate:
        """The worst case of one evaluation (of one item's, for a predicate)."""
        self._checked = _checked(serialized)
        self._walked = 0
        scope: dict[str, Bound] = dict(self.names)
        if item is not None:
            scope[item[0]] = self.message(item[1])
        return self._expr(self._checked.expr, scope)

    # one node -----------------------------------------------------------------------------

    def _expr(self, data: bytes, scope: Scope) -> Estimate:
        self._walked += 1
        if self._walked > WALK:
            raise TooComplex(f"its cost estimate would take over {WALK:,} steps")
        node = _fields(data)
        ident = node.get(2, [0])[-1]
        if 3 in node:
            return Estimate(NODE, _constant(_fields(_one(node, 3))))
        if 4 in node:
            name = _text(_fields(_one(node, 4)), 1)
            return Estimate(NODE, self._ident(name, scope))
        if 5 in node:
            return self._select(_fields(_one(node, 5)), scope)
        if 6 in node:
            return self._call(ident, _fields(_one(node, 6)), scope)
        if 7 in node:
            elements = [self._expr(e, scope) for e in _fields(_one(node, 7)).get(1, [])]
            return _collection(elements, len(elements))
        if 8 in node:
            return self._struct(_fields(_one(node, 8)), scope)
        if 9 in node:
            return self._comprehension(_fields(_one(node, 9)), scope)
        return Estimate(NODE, SCALAR)

    def _ident(self, name: str, scope: Scope) -> Bound:
        return scope[name] if name in scope else _top(self.sizes)

    def _select(self, select: dict[int, list[Any]], scope: Scope) -> Estimate:
        operand_bytes = _one(select, 1)
        name = _text(select, 2)
        operand = _fields(operand_bytes)
        if 4 in operand and _text(_fields(_one(operand, 4)), 1) == "variables":
            variable = self.variables.get(name, _top(self.sizes))
            return Estimate(NODE, variable)
        inner = self._expr(operand_bytes, scope)
        bound = inner.bound
        if _one(select, 3, 0):  # has(): a test only
            return Estimate(inner.cost + NODE, SCALAR)
        if bound.message is not None and name in bound.message.fields_by_name:
            return Estimate(inner.cost + NODE, self._field(bound.message.fields_by_name[name]))
        return Estimate(inner.cost + NODE + SCAN * len(name), bound.items or _top(self.sizes))

    def _field(self, descriptor: FieldDescriptor) -> Bound:
        if descriptor.message_type is not None:
            one = self.message(descriptor.message_type)
        elif descriptor.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            one = self.string_field(descriptor.name)
        else:
            one = SCALAR
        if descriptor.is_repeated:
            return Bound(self.sizes.items, items=one)
        return one

    def _struct(self, struct: dict[int, list[Any]], scope: Scope) -> Estimate:
        entries = [_fields(e) for e in struct.get(2, [])]
        values = [self._expr(_one(e, 4), scope) for e in entries]
        keys = [self._expr(_one(e, 3), scope) for e in entries if 3 in e]
        made = _collection(values, len(values))
        cost = made.cost + sum(k.cost for k in keys)
        if _text(struct, 1):  # a message: its fields as bounded as what they are set to
            return Estimate(cost, Bound(1, items=made.bound.items))
        key = _joined([k.bound for k in keys]) if keys else None
        return Estimate(cost, Bound(len(values), items=made.bound.items, keys=key))

    def _comprehension(self, loop: dict[int, list[Any]], scope: Scope) -> Estimate:
        iterated = self._expr(_one(loop, 2), scope)
        start = self._expr(_one(loop, 4), scope)
        range_ = iterated.bound
        count = min(entries(range_), BUDGET)
        item = (range_.keys if range_.keys is not None else range_.items) or _top(self.sizes)
        variable, accumulator = _text(loop, 1), _text(loop, 3)
        second = _text(loop, 8)

        def step(each: Bound, accu: Bound) -> tuple[int, Bound]:
            inner = dict(scope)
            inner[variable] = each
            if second:
                inner[second] = range_.items or _top(self.sizes)
            inner[accumulator] = accu
            condition = self._expr(_one(loop, 5), inner) if 5 in loop else Estimate(0, SCALAR)
            stepped = self._expr(_one(loop, 6), inner)
            return condition.cost + stepped.cost + NODE, stepped.bound

        # how the accumulator grows: one step from its start, then as many again; a step
        # sees it half grown on average (a macro's step only appends to it, at a cost linear
        # in its size), the result all of it
        _, once = step(item, start.bound)
        grown = average = start.bound
        if once.size > start.bound.size:
            growth = once.size - start.bound.size
            joined = join(start.bound, once)
            grown = Bound(_sat(start.bound.size + count * growth), joined.items, joined.keys)
            half = _sat(start.bound.size + (count * growth + 1) // 2)
            average = Bound(half, joined.items, joined.keys)
        if range_.shared and count > 1:
            # the entries share one total: each as large as an even share, or one as large as
            # all of it and the rest empty, whichever costs more
            share = Bound(max(range_.size // count, 1), item.items, item.keys, shared=True)
            even = count * step(share, average)[0]
            empty = Bound(0, shared=True)
            lopsided = step(item, average)[0] + (count - 1) * step(empty, average)[0]
            loop_cost = max(even, lopsided)
        else:
            loop_cost = count * step(item, average)[0]
        inner = dict(scope)
        inner[accumulator] = grown
        result = self._expr(_one(loop, 7), inner)
        cost = iterated.cost + start.cost + loop_cost + result.cost
        return Estimate(_sat(cost), result.bound)

    def _call(self, ident: int, call: dict[int, list[Any]], scope: Scope) -> Estimate:
        function = _text(call, 2)
        operands = ([_one(call, 1)] if 1 in call else []) + list(call.get(3, []))
        estimates = [self._expr(operand, scope) for operand in operands]
        cost = sum(e.cost for e in estimates) + NODE
        bounds = [e.bound for e in estimates]
        overloads = self._checked.overloads.get(ident, [])
        extra, bound = _function(function, overloads, bounds, self.sizes)
        return Estimate(_sat(cost + extra), bound)


def _top(sizes: Sizes) -> Bound:
    """Whatever the inputs can hold: the largest text, entries as large, cyclic."""
    bound = Bound(max(sizes.text_bytes, sizes.fields_bytes, sizes.items))
    bound.items = bound
    bound.keys = bound
    return bound


def _joined(bounds: list[Bound]) -> Bound:
    result = bounds[0]
    for bound in bounds[1:]:
        result = join(result, bound)
    return result


def _collection(elements: list[Estimate], count: int) -> Estimate:
    cost = sum(e.cost for e in elements) + NODE + COPY * count
    items = _joined([e.bound for e in elements]) if elements else None
    return Estimate(cost, Bound(count, items=items))


def _constant(constant: dict[int, list[Any]]) -> Bound:
    if 6 in constant or 7 in constant:
        return Bound(len(bytes(_one(constant, 6 if 6 in constant else 7))))
    return SCALAR


def _string(size: int) -> Bound:
    return Bound(_sat(size))


_SCALAR_OPS = {"_-_", "_*_", "_/_", "_%_", "-_", "!_", "_&&_", "_||_", "@not_strictly_false"}
_COMPARE = {"_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_"}
_SEARCH = {"contains", "startsWith", "endsWith", "indexOf", "lastIndexOf", "matches"}
_SAME_SIZE = {"lowerAscii", "upperAscii", "trim", "reverse", "substring"}
_Rule = Callable[[list[Bound], Sizes], tuple[int, Bound]]


def _function(
    function: str, overloads: list[str], args: list[Bound], sizes: Sizes
) -> tuple[int, Bound]:
    """The cost of a call beyond its operands', and the bound on its value."""
    if function in _SCALAR_OPS:
        return 0, SCALAR
    if function == "_?_:_":
        return 0, join(args[1], args[2])
    if function in _COMPARE:
        return SCAN * min(flat(args[0]), flat(args[1])), SCALAR
    if function == "_+_":
        left, right = args
        if any(o.startswith("add_list") for o in overloads):
            items = join(left.items, right.items) if left.items and right.items else None
            size = _sat(left.size + right.size)
            return COPY * size, Bound(size, items=items or left.items or right.items)
        if any(o in ("add_string", "add_bytes") for o in overloads):
            size = _sat(flat(left) + flat(right))
            return BUILD * size, _string(size)
        if all(o.startswith(("add_int", "add_uint", "add_double")) for o in overloads):
            return 0, SCALAR
        size = _sat(flat(left) + flat(right))  # dyn: whichever, the dearest
        return COPY * size, Bound(size, items=left.items or right.items)
    if function == "_[_]":
        container = args[0]
        return SCAN * flat(args[1]), container.items or _top(sizes)
    if function == "@in":
        needle, haystack = args
        if haystack.lookup or (haystack.keys is not None and not haystack.shared):  # a map
            return SCAN * flat(needle), SCALAR
        each = flat(haystack.items or needle)
        if haystack.shared:  # the entries' bytes are one total: all compared at most once
            return _sat(IN_ENTRY * entries(haystack) + SCAN * flat(haystack)), SCALAR
        return _sat(haystack.size * (IN_ENTRY + SCAN * min(flat(needle), each))), SCALAR
    if function == "size":
        return SCAN * args[0].size, SCALAR
    if function in _SEARCH:
        return _sat(SCAN * 4 * sum(flat(a) for a in args)), _string(1)
    if function in _SAME_SIZE:
        size = flat(args[0])
        return BUILD * size, _string(size)
    if function == "charAt":
        return SCAN * flat(args[0]), _string(4)
    if function in ("quote", "strings.quote"):
        size = _sat(6 * flat(args[0]) + 2)
        return BUILD * size, _string(size)
    if function == "replace":
        text, replacement = flat(args[0]), flat(args[2]) if len(args) > 2 else 0
        size = _sat(text + (text + 1) * replacement)
        return _sat(REPLACE * size + SCAN * text), _string(size)
    if function == "split":
        text = flat(args[0])
        return _sat(SPLIT * (text + 1) + SCAN * text), Bound(text + 1, items=_string(text))
    if function == "join":
        items = args[0]
        separator = flat(args[1]) if len(args) > 1 else 0
        size = _sat(flat(items) + items.size * separator)
        return _sat(BUILD * size + NODE * items.size), _string(size)
    if function == "format":
        size = _sat(flat(args[0]) + 2 * sum(flat(a) for a in args[1:]) + 64)
        return BUILD * size, _string(size)
    if function in ("string", "bytes"):
        size = _sat(2 * flat(args[0]) + 32)
        return BUILD * size, _string(size)
    if function in ("int", "uint", "double", "bool", "duration", "timestamp", "type"):
        return SCAN * flat(args[0]), SCALAR
    if function == "dyn":
        return 0, args[0]
    # anything else: as dear as building many times all it is given
    size = _sat(8 * sum(flat(a) for a in args) + 64)
    return BUILD * size, Bound(size, items=_top(sizes), keys=_top(sizes))


CHUNK = 16  # a predicate's items are judged in lists of this many (see environment.py)
ACTIVATION = 20_000  # the bindings of one evaluation made (the fields, the assembly)


def over_items(per_item: int, count: int) -> int:
    """A predicate judged over `count` items in lists of `CHUNK`, in one evaluation: each
    item's judgement, the copies of the inner lists built (half a chunk each on average) and
    of the outer list of chunks, and the evaluation's bindings."""
    chunks = -(-count // CHUNK)
    inner = count * (per_item + ITEM + COPY * min(count, CHUNK) // 2)
    return _sat(inner + chunks * (chunks * COPY // 2 + 2 * NODE) + ACTIVATION)
