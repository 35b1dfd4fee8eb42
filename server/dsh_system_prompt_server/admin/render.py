"""The admin page's Jinja2 templates, rendered anywhere: on the loop or in a worker thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,  # every name and text on the page comes from a client
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(template: str, **values: Any) -> str:
    """`template` with `values`; the values are plain data, read and never changed."""
    return _templates.get_template(template).render(**values)
