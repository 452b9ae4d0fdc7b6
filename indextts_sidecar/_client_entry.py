"""The ``indextts-client`` console script's entry point: a Ctrl-C at any moment is one line and exit 130.

It lives in this package, not in ``indextts_client``, because importing ``indextts_client``
is the slow part of start-up (anyio, msgspec, numpy, the client): this package imports only
its version, so the guard below is in place before any of that starts.  While the CLI
imports, SIGINT ends the process at once (nothing is running yet); once it runs, the usual
``KeyboardInterrupt`` lets each command clean up (``setup`` installs its own handler).
"""

import os
import signal
import sys

_LINE = b"indextts-client: interrupted\n"
EXIT_INTERRUPTED = 130


def _exit_now(signum: int, frame: object) -> None:
    os.write(2, _LINE)
    os._exit(EXIT_INTERRUPTED)


signal.signal(signal.SIGINT, _exit_now)


def main() -> int:
    """Import the CLI under the guard, then run it with Python's own SIGINT handling."""
    signal.signal(signal.SIGINT, _exit_now)
    from indextts_client._cli import main as cli

    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = cli()
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    # Exit quietly: a Ctrl-C during the interpreter's shutdown must not print a traceback either.
    signal.signal(signal.SIGINT, _exit_now)
    if code == EXIT_INTERRUPTED:
        sys.stdout.flush()
        os.write(2, _LINE)
    return code
