"""python -m bench: the same as `cbserve bench` (see bench.serve); `python -m bench
scheduler` is `cbserve bench scheduler` (see bench.scheduler_bench) and `python -m bench
accuracy` is `cbserve bench accuracy` (see bench.accuracy)."""

import sys

if sys.argv[1:2] == ["scheduler"]:
    from bench.scheduler_bench import main as scheduler_main

    sys.exit(scheduler_main(sys.argv[2:], prog="python -m bench scheduler"))
if sys.argv[1:2] == ["accuracy"]:
    from bench.accuracy import main as accuracy_main

    sys.exit(accuracy_main(sys.argv[2:]))

from bench.serve import main

sys.exit(main())
