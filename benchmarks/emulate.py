#!/usr/bin/env python3
"""Self-test of the emulated hosts: TCP rates through rate-limited network namespaces.

    python -m benchmarks.emulate selftest --gbps 1 --seconds 3

The implementation is reducer/bench/emulate.py (`reduction-server bench --emulate-gbps` uses it);
this script is the runnable entry point in the source tree, the same as
`python -m reducer.bench.emulate`. Needs root and iproute2.
"""

import sys

from reducer.bench.emulate import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
