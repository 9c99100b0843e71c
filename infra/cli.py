"""What every command line of the project shares: the name its ``--help`` shows.

Each module with a ``main(argv)`` builds its own argparse parser (``python -m <module>``); the
``social`` app (social/cli.py) runs the same ``main`` and sets :data:`COMMAND` meanwhile, so the
usage line names the command the user typed (``usage: social verify ...``), not ``__main__.py``.
"""

from __future__ import annotations

COMMAND: str | None = None  # "social verify" while the social app runs a command


def command_name(module: str) -> str:
    """A parser's ``prog``: the ``social`` command running it, else ``python -m <module>``."""
    return COMMAND or f"python -m {module}"
