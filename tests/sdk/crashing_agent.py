"""An agent that dies mid-run: `python -m tests.sdk.crashing_agent URL KEY`.

It opens a session, prints its id, makes two calls that commit, starts a third whose tool
runs but whose process dies (os._exit, no cleanup, no /fail) before it commits. The session
stays running on the server, as after a crash. No Django: only the SDK and the tools.
"""

from __future__ import annotations

import os
import sys

from undolog import UndoLogClient

from tests.sdk.agent_tools import list_inactive_accounts, send_email


def main(url: str, key: str) -> None:
    client = UndoLogClient(url, key)
    session = client.session(agent="cleanup").__enter__()
    print(session.id, flush=True)
    list_inactive_accounts()
    send_email("ana@example.com")
    send_email("ben@example.com")
    os._exit(3)  # killed before the third call: nothing more is sent


if __name__ == "__main__":
    main(*sys.argv[1:3])
