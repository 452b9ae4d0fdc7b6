"""An application that never set up logging sees no log lines from the client."""

from __future__ import annotations

import subprocess
import sys

from harness import REPO

APP = """
import anyio
from indextts_client import Client, CrashedError

async def main():
    async with Client("fake", restart_backoff=0) as client:
        try:
            await client.synthesize("x", crash_at=0, exit_code=70)
        except CrashedError as exc:
            print("crashed", exc.exit_code)
        audio = await client.synthesize("again")
        print("restarted", client.restarts, len(audio))

anyio.run(main)
"""


def test_a_crash_and_restart_print_nothing_on_stderr_without_logging_configured() -> None:
    result = subprocess.run(
        [sys.executable, "-c", APP], capture_output=True, text=True, cwd=REPO, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["crashed 70", "restarted 1 7200"]
    # The exception already told the application; logging's last resort must not repeat it.
    assert result.stderr == ""
