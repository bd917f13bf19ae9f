"""Former entry point of the serving benchmark, kept so `python -m bench.throughput` works.

The benchmark is now `cbserve bench` (bench.serve); this forwards its arguments there.
"""

import sys

from bench.serve import main

if __name__ == "__main__":
    sys.exit(main())
