#!/usr/bin/env python3
"""rs vs ring vs gloo all-reduce benchmark; the same as `reduction-server bench`.

    python -m benchmarks.bench_allreduce --workers 4 --reducers 4 --sizes 4K:64M --emulate-gbps 1

The implementation is reducer/bench/ (so the installed CLI has it); this script is the
runnable entry point in the source tree. See docs/performance.md.
"""

import sys

from reducer.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench"] + sys.argv[1:]))
