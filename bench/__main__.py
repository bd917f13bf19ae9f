"""python -m bench: the same as `cbserve bench` (see bench.serving.serve); `python -m bench
scheduler` is `cbserve bench scheduler` (see bench.scheduler.run) and `python -m bench
accuracy` is `cbserve bench accuracy` (see bench.accuracy.gate)."""

import sys

if sys.argv[1:2] == ["scheduler"]:
    from bench.scheduler.run import main as scheduler_main

    sys.exit(scheduler_main(sys.argv[2:], prog="python -m bench scheduler"))
if sys.argv[1:2] == ["accuracy"]:
    from bench.accuracy.gate import main as accuracy_main

    sys.exit(accuracy_main(sys.argv[2:]))

from bench.serving.serve import main

sys.exit(main())
