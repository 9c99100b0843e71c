"""``python -m pipelines.batch_layer``: see :mod:`pipelines.batch_layer.job`."""

import sys

from pipelines.batch_layer.job import main

sys.exit(main())
