"""``python -m reducer.gpucheck``: see reducer.gpucheck.main."""

import sys

from .main import main

sys.exit(main())
