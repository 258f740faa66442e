"""`python -m nas.llm.guard COMMAND...`: run COMMAND and stop it when the
process that started the guard dies, however it died. The local LLM server
runs in its own session (so a Ctrl-C aimed at `nas` does not hit it
mid-reply); without a guard, a `nas` killed by SIGTERM or SIGKILL would
leave it running, and busy, for good."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m nas.llm.guard COMMAND [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    child = subprocess.Popen(argv)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    while child.poll() is None:
        if os.getppid() != parent:  # orphaned: re-parented to init or a subreaper
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
            break
        time.sleep(POLL_S)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
