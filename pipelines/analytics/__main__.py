import sys

from pipelines.analytics.runner import main

sys.exit(main())
