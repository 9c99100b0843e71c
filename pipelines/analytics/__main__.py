import sys

from infra.cli import run_main
from pipelines.analytics.runner import main

sys.exit(run_main(main, "pipelines.analytics"))
