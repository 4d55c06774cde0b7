"""Every URL of the URL conf, walked with malformed ids and with another org's real ids, as an
agent and as a reviewer of that other org: never a 5xx, never a byte of the other org's data.
Also: a JSON body nested past the limit is a 400 naming the limit, on every API path."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, OrgWebhook
from core.parsers import MAX_JSON_DEPTH
from effects.models import Effect, Session, UndoEntry
from orgs.models import Event
from tests.conftest import intercept, make_persona, open_session, register_standard_tools

CANARY = "canary-7f3e91"  # in the first org's data: it must never appear in an answer to the other org
MALFORMED = ["-" * 36, "not-a-uuid", "0" * 35 + "g", "%C3%A9t%C3%A9", "x" * 300, "nul%00byte"]
REGEX_GROUP = re.compile(r"\(\?P<(\w+)>[^)]*\)")
CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")


def routes() -> Iterator[tuple[str, bool]]:
    """Every pattern as a route string with its parameters left in, and whether it has any."""
    def walk(patterns, prefix: str) -> Iterator[str]:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                yield prefix + str(pattern.pattern)

    for route in walk(get_resolver().url_patterns, ""):
        yield route, bool(REGEX_GROUP.search(route) or CONVERTER.search(route))


def concrete(route: str, value: str) -> str:
    path = CONVERTER.sub(value, REGEX_GROUP.sub(value, route))
    return "/" + path.replace("^", "").replace("$", "")


@pytest.fixture
def first(db):
    """An org with one of everything a path can name, and the canary in its data."""
    persona = make_persona("first", agent_name=f"bot-{CANARY}")
    register_standard_tools(persona)
    session = open_session(persona)
    assert intercept(persona, session, "send_email", {"to": f"{CANARY}@x.io"}, 1).status_code == 201
    held = intercept(persona, session, "delete_account", {"account_id": CANARY}, 2)
    assert held.status_code == 202, held.content
    OrgWebhook.objects.create(org=persona.org, url="https://hooks.example.com/first", description=CANARY)
    return persona


@pytest.fixture
def other(db):
    persona = make_persona("other", agent_name="other-bot")
    persona.browser = APIClient()  # the reviewer logged in with a session: the dashboard's pages too
    persona.browser.force_login(persona.reviewer.user)
    return persona


def callers(other) -> dict[str, APIClient]:
    return {"agent": other.api, "reviewer": other.reviewer, "reviewer (session)": other.browser}


def ids_of(persona) -> dict[str, str]:
    org = persona.org
    return {
        "sessions": str(Session.objects.get(org=org).pk),
        "effects": str(Effect.objects.filter(org=org).first().pk),
        "undo-entries": str(UndoEntry.objects.for_org(org).get().pk),
        "approvals": str(ApprovalRequest.objects.get(org=org).pk),
        "webhooks": str(OrgWebhook.objects.get(org=org).pk),
        "agents": persona.agent.name,
    }


def state_of(persona) -> list:
    org = persona.org
    return [list(Session.objects.filter(org=org).values_list("state", "step_index")),
            list(Effect.objects.filter(org=org).values_list("state")),
            list(ApprovalRequest.objects.filter(org=org).values_list("state", "timeout_at")),
            list(OrgWebhook.objects.filter(org=org).values_list("id")),
            Event.objects.filter(org=org).count(), persona.agent.__class__.objects.get(pk=persona.agent.pk).state]


def send(client: APIClient, method: str, path: str):
    if method in ("GET", "OPTIONS"):
        return getattr(client, method.lower())(path)
    return getattr(client, method.lower())(path, {}, format="json")


def assert_safe(response, who: str, method: str, path: str, secrets: set[str]) -> None:
    where = f"{who} {method} {path}"
    assert response.status_code < 500, f"{where}: {response.status_code} {response.content[:300]!r}"
    body = response.content.decode(errors="replace")
    leaked = [secret for secret in secrets if secret in body]
    assert not leaked, f"{where} leaks {leaked}: {body[:300]}"
    if path.startswith("/api/v1/") and response.status_code >= 400:
        assert "error" in json.loads(body), f"{where}: an API error without a code: {body[:300]}"


def methods_for(path: str) -> list[str]:
    # Every method on the API; the admin and the pages are forms: GET and POST.
    return ["GET", "POST", "PATCH", "PUT", "DELETE", "OPTIONS"] if path.startswith("/api/") else ["GET", "POST"]


def test_it_answers_every_url_with_a_malformed_id_without_a_5xx_or_a_leak(first, other):
    secrets = {CANARY, *ids_of(first).values()}
    walked = 0
    for route, has_params in routes():
        if not has_params or "logout" in route:
            continue
        for value in MALFORMED:
            path = concrete(route, value)
            for method in methods_for(path):
                for who, client in callers(other).items():
                    assert_safe(send(client, method, path), who, method, path, secrets)
                    walked += 1
    assert walked > 1000  # the URL conf was really walked, the admin's and the pages' included


def test_it_answers_the_other_orgs_real_ids_with_a_404_and_changes_nothing(first, other):
    ids = ids_of(first)
    before = state_of(first)
    walked = 0
    for route, has_params in routes():
        if not has_params or not route.startswith("api/v1/"):
            continue
        resource = route.removeprefix("api/v1/").lstrip("^").split("/")[0]
        path = concrete(route, ids.get(resource, ids["sessions"]))
        for method in methods_for(path):
            for who, client in callers(other).items():
                response = send(client, method, path)
                # What the path itself says may be echoed ("No agent named …"); nothing else may.
                secrets = {value for value in {CANARY, *ids.values()} if value not in path}
                assert_safe(response, who, method, path, secrets)
                # 400: the (empty) body was refused before any lookup; a 409 or a 2xx would say
                # the row exists.
                # OPTIONS describes the view (name, what it parses), never the row.
                allowed = (400, 401, 403, 404, 405) + ((200,) if method == "OPTIONS" else ())
                assert response.status_code in allowed, \
                    f"{who} {method} {path}: {response.status_code} {response.content[:200]!r}"
                walked += 1
    assert walked > 100
    assert state_of(first) == before


def test_it_answers_every_parameterless_url_without_a_5xx(first, other):
    secrets = {CANARY, *ids_of(first).values()}
    for route, has_params in routes():
        if has_params or "logout" in route:
            continue
        path = concrete(route, "")
        for who, client in callers(other).items():
            assert_safe(client.get(path), who, "GET", path, secrets)


def test_it_refuses_a_nul_in_any_urls_path_or_query_with_a_400(first, other):
    # PostgreSQL stores no NUL in text: a lookup or filter by one must never reach the database.
    filters = "?state=%00&kind=a%00&agent=%00&session=%00&cursor=%00&limit=%00&q=%00"
    before = state_of(other)
    walked = 0
    for route, has_params in routes():
        if "logout" in route:
            continue
        path = concrete(route, "nul%00byte") if has_params else concrete(route, "") + filters
        for who, client in callers(other).items():
            response = client.get(path)
            assert response.status_code == 400, f"{who} GET {path}: {response.status_code} {response.content[:200]!r}"
            if path.startswith("/api/"):
                assert response.json()["error"] == "invalid" and "NUL" in response.json()["message"]
            walked += 1
    assert walked > 100
    assert state_of(other) == before


def nested(depth: int) -> object:
    value: object = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def nested_text(depth: int) -> str:
    """`nested(depth)` as JSON text, built without recursion (json.dumps would overflow)."""
    opens = "".join("[" if level % 2 else '{"k":' for level in reversed(range(depth)))
    closes = "".join("]" if level % 2 else "}" for level in range(depth))
    return opens + '"leaf"' + closes


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5000])
def test_it_refuses_json_nested_past_the_limit_naming_it(first, depth):
    session = str(Session.objects.get(org=first.org).pk)
    body = '{"tool": "send_email", "step_index": 3, "args": ' + nested_text(depth) + "}"
    assert json.loads(nested_text(40)) == nested(40)
    before = Effect.objects.filter(org=first.org).count()

    for path in (f"/api/v1/sessions/{session}/intercept", "/api/v1/tools", "/api/v1/sessions"):
        response = first.api.generic("POST", path, body, content_type="application/json")

        assert response.status_code == 400, (path, response.content[:300])
        assert response.json()["error"] == "too_deep"
        assert response.json()["limit"] == MAX_JSON_DEPTH
        assert str(MAX_JSON_DEPTH) in response.json()["message"]
    assert Effect.objects.filter(org=first.org).count() == before


def test_it_accepts_json_nested_up_to_the_limit(first):
    session = open_session(first)
    args = {"to": "deep@x.io", "tree": nested(MAX_JSON_DEPTH - 2)}

    response = intercept(first, session, "send_email", args, 3)

    assert response.status_code == 201, response.content[:300]


@pytest.mark.parametrize("body", [
    {"tool": "send_email", "args": {"to": "nul\u0000@x.io"}, "step_index": 3},
    {"tool": "send_email", "args": {"to": "a@x.io"}, "step_index": 3, "reasoning": "a\u0000b"},
    {"tool": "send_email", "args": {"to": "a@x.io"}, "step_index": 3,
     "safe_calls": [{"tool": "t" * 201, "step_index": 2, "args": {}}]},
], ids=["nul in args", "nul in reasoning", "safe call name past its column"])
def test_it_refuses_what_the_database_cannot_store_with_a_400(first, body):
    session = open_session(first)

    response = intercept(first, session, body["tool"], body["args"], body["step_index"],
                         **{k: v for k, v in body.items() if k not in ("tool", "args", "step_index")})

    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"] == "invalid"
    assert not Effect.objects.filter(session_id=session).exists()
