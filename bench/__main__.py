"""python -m bench: the same as `cbserve bench` (see bench.serve); `python -m bench
scheduler` is `cbserve bench scheduler` (see bench.scheduler_bench)."""

import sys

if sys.argv[1:2] == ["scheduler"]:
    from bench.scheduler_bench import main as scheduler_main

    sys.exit(scheduler_main(sys.argv[2:], prog="python -m bench scheduler"))

from bench.serve import main

sys.exit(main())
