"""Two checkouts of this project side by side: the per-request cost of a change, interleaved.

    git worktree add /tmp/before COMMIT
    .venv/bin/python bench/bench_ab.py --before /tmp/before [--rounds 7] [--requests 1000]
        [the options of bench_requests.py: --op, --seconds, --chunk-seconds, --in-flight]

Runs bench_requests.py's measure of ours (a client and its sidecar, on asyncio and on
trio) from both checkouts, this one and ``--before``, taking turns round by round (the
order rotating; fresh processes each round, both checkouts with the same hash seed), and
prints each one's requests/s, CPU and minor page faults (the parent's) per request, with
the per-round speed ratio of this checkout over the other: a drift of the machine hits
both alike.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _checkouts import REPO, add_before, compile_checkouts  # noqa: E402
from bench_requests import interleave, ours, parse_args, ratios, stat  # noqa: E402


def main() -> None:
    args = parse_args(__doc__.split("\n\n")[0], lambda parser: add_before(parser, required=True))
    compile_checkouts(REPO, args.before)
    backends = ("asyncio", "trio")
    checkouts = ((args.before, "before"), (REPO, "now"))
    contenders = [ours(backend, args, repo, name) for backend in backends for repo, name in checkouts]
    rows, faults = interleave(contenders, args)
    n = args.requests
    print(f"{args.rounds} rounds x {n} requests, {args.in_flight} in flight; median (min-max):")
    print(
        f"{'':18} {'requests/s':>20} {'parent CPU/req (us)':>22} {'child CPU/req (us)':>21}"
        f" {'parent faults/req':>20} {'speed now/before':>18}"
    )
    for backend in backends:
        before = rows[f"before ({backend})"]
        for name in ("before", "now"):
            label = f"{name} ({backend})"
            values = rows[label]
            rates = [n / wall for wall, _, _ in values]
            speed = ratios(rates, [n / wall for wall, _, _ in before])
            print(
                f"{label:18} {stat(rates, 1):>20} {stat([c / n for _, c, _ in values], 1e6):>22}"
                f" {stat([c / n for _, _, c in values], 1e6):>21} {stat(faults[label], 1):>20} {speed:>18}"
            )


if __name__ == "__main__":
    main()
