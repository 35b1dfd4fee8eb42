"""Large registries paginate: a Scopes page shows at most `PAGE_ROWS` registrations.

The tree keeps its shape: a page holds the scopes whose registrations fall in
its range, with the ancestors they hang under (their rows on other pages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .views import ScopeNode, ScopesView

PAGE_ROWS = 250  # registrations on one page; a render of them takes a few milliseconds


@dataclass(frozen=True)
class ScopesPage:
    view: ScopesView  # the tree of this page only
    page: int  # from 1
    pages: int
    hidden: int  # registrations on other pages


def page_of(view: ScopesView, page: int, rows: int = PAGE_ROWS) -> ScopesPage:
    """Page `page` (clamped to those there are) of `view`."""
    total = sum(_rows(node) for node in view.roots)
    pages = max(1, math.ceil(total / rows))
    page = min(max(page, 1), pages)
    start, end = (page - 1) * rows, page * rows
    position = 0

    def prune(node: ScopeNode) -> ScopeNode | None:
        nonlocal position
        first = position
        position += len(node.registrations)
        shown = node.registrations[max(0, start - first) : max(0, end - first)]
        children = [kept for child in node.children if (kept := prune(child)) is not None]
        here = start <= first < end or (first == total and page == pages)
        if not shown and not children and not (here and not node.registrations):
            return None
        return replace(node, registrations=shown, children=children)

    roots = [kept for root in view.roots if (kept := prune(root)) is not None]
    shown = sum(_rows(node) for node in roots)
    return ScopesPage(replace(view, roots=roots), page, pages, total - shown)


def _rows(node: ScopeNode) -> int:
    return len(node.registrations) + sum(_rows(child) for child in node.children)
