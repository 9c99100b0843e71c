"""``python -m social``: the same app as the ``social`` console script."""

from social.cli import app

app(prog_name="social")
