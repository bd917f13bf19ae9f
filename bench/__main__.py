"""python -m bench: the same as `cbserve bench`, subcommands included (bench.commands);
without one, the serving benchmark (bench.serving.serve)."""

import sys

from bench import commands

code = commands.run(sys.argv[1:], prog="python -m bench")
if code is None:
    from bench.serving.serve import main

    code = main()
sys.exit(code)
