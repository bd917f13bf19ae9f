"""python -m bench: the same as `cbserve bench` (see bench.serve)."""

import sys

from bench.serve import main

sys.exit(main())
