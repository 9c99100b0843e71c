"""The HTML reports' pages, rendered from the Jinja2 templates in infra/templates/.

Every page extends ``base.html.j2`` (the page shell and the shared CSS); ``render(template, **ctx)``
renders one with autoescaping on, so a value from a report is text, never markup, unless a
template marks it safe (an embedded plot's base64 PNG). An undefined name is an error, not an
empty string.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

TEMPLATES = Path(__file__).resolve().parent / "templates"


@cache
def environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(template: str, **ctx) -> str:
    """The page ``template`` (a file name under infra/templates/) with ``ctx``."""
    return environment().get_template(template).render(**ctx)
