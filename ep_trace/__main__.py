"""``python -m ep_trace``: the ``ep-trace`` command line."""

import sys

try:
    from ep_trace.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line is still importing (typer, polars)
    sys.stderr.write("interrupted\n")
    sys.exit(130)

main()
