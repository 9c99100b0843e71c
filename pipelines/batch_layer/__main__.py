"""``python -m pipelines.batch_layer``: see :mod:`pipelines.batch_layer.job`."""

import sys

from infra.cli import run_main
from pipelines.batch_layer.job import main

sys.exit(run_main(main, "pipelines.batch_layer"))
