"""AgentDojo (v1.2.2 suites, package `agentdojo`), model-free, through the real server: does a
run-aware policy stop every injected write while leaving benign tasks alone?

This process sets up the bench database, an org with an agent key and an admin's token, and serves
the API (gunicorn); the replay (bench/agentdojo_replay.py) runs in the bench venv `.venv-agentdojo`
(`make .venv-agentdojo`: bench/agentdojo-requirements.txt, kept apart so the server's requirements
stay lean). Per suite (`--suite name=config.toml`, default workspace and slack with the configs in
bench/agentdojo/) and per configuration (tiers only, approve everything, run-aware) and attack
wording it prints the injected writes executed unseen, those flagged, and the benign tasks
interrupted and flagged. Without arguments it runs held out, both ways: the policy designed on
workspace reported on slack, then the one designed on slack reported on workspace
(`--design-on`; bench/agentdojo_replay.py). Exit status 1 when a run-aware goal (0 unseen, <= 15 %
interrupted, <= 15 % flagged, never worse than tiers only; each suite and wording) is not met.
"""

from __future__ import annotations

import subprocess
import sys
import time

from bench.common import BASE_DIR, Server, setup_django

VENV = BASE_DIR / ".venv-agentdojo" / "bin" / "python"
SUITES = ["workspace", "slack", "helpdesk"]  # helpdesk: our own (bench/agentdojo/helpdesk/suite.py)
DESIGNED_ON = ["workspace", "slack"]  # held out: the policy designed on one, reported on the others


def main(argv: list[str]) -> int:
    if not VENV.exists():
        print(f"{VENV} is missing: run `make .venv-agentdojo` first", file=sys.stderr)
        return 2
    setup_django()
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from orgs.models import Agent, AgentKey, Membership, Organization

    org = Organization.objects.create(slug="agentdojo", name="AgentDojo", rate_limit_per_key=10**9,
                                      rate_limit_per_org=10**9)
    agent = Agent.objects.create(org=org, name="agentdojo")
    _, key = AgentKey.issue(agent)
    user = get_user_model().objects.create_user("agentdojo-reviewer", password="pw-bench")
    Membership.objects.create(user=user, org=org, role="admin")
    token = Token.objects.create(user=user).key
    suites = [a for a in argv if "=" in a and not a.startswith("-")] or \
        [f"{name}={BASE_DIR / 'bench' / 'agentdojo' / f'{name}.toml'}" for name in SUITES]
    rest = [a for a in argv if a not in suites]
    # Held out both ways unless told otherwise: design on one suite, report the others.
    # Each suite is reported once, in the first way it is held out of.
    ways: list[list[str]] = [[]]
    if not argv:
        ways, reported = [], set()
        for design in DESIGNED_ON:
            report = [s for s in suites if s.partition("=")[0] not in (design, *reported)]
            reported.update(s.partition("=")[0] for s in report)
            ways.append(["--design-on", design, *[f"--suite={s}" for s in report]])
    server = Server("gunicorn (WSGI)", workers=2)
    started = time.monotonic()
    code = 0
    try:
        for way in ways:
            named = [] if way else [f"--suite={s}" for s in suites]
            command = [str(VENV), "-m", "bench.agentdojo_replay", "--base", server.base,
                       "--key", key, "--token", token, *named, *rest, *way]
            code |= subprocess.run(command, cwd=BASE_DIR).returncode
    finally:
        server.stop()
    print(f"({time.monotonic() - started:.0f} s; the machine is shared, so times vary)")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
