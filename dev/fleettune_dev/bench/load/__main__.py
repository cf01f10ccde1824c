"""``python -m fleettune_dev.bench.load``: the same as `fleettune bench load`."""

import sys

from fleettune_dev.bench.load.cli import main

raise SystemExit(main(sys.argv[1:]))
