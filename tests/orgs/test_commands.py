"""createorg, createagent (the key alone on the last line), createreviewer, setupdemo."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import CommandError, call_command

from orgs.models import Agent, AgentKey, Membership, Organization


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_createagent_prints_a_working_key_alone_on_the_last_line(db, client):
    run("createorg", "acme")

    output = run("createagent", "acme", "cleanup")

    key = output.strip().splitlines()[-1]
    assert AgentKey.authenticate(key).agent == Agent.objects.get(name="cleanup")
    response = client.get("/api/v1/tools", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200


def test_createagent_needs_an_existing_org(db):
    with pytest.raises(CommandError, match="No organization"):
        run("createagent", "nope", "cleanup")


def test_createorg_refuses_a_bad_time_zone_and_a_duplicate(db):
    with pytest.raises(CommandError, match="time zone"):
        run("createorg", "acme", "--time-zone", "Mars/Olympus")
    run("createorg", "acme", "--time-zone", "Europe/Berlin")
    with pytest.raises(CommandError):
        run("createorg", "acme")
    assert Organization.objects.get().time_zone == "Europe/Berlin"


def test_createreviewer_makes_a_member_with_the_role(db):
    run("createorg", "acme")

    run("createreviewer", "acme", "alice", "--password", "s3cret-pass")
    run("createreviewer", "acme", "vic", "--password", "s3cret-pass", "--role", "viewer")

    assert authenticate(username="alice", password="s3cret-pass") is not None
    assert Membership.objects.get(user__username="alice").role == "reviewer"
    assert Membership.objects.get(user__username="vic").role == "viewer"


def test_setupdemo_runs_once(db):
    first = run("setupdemo")
    second = run("setupdemo")

    assert AgentKey.authenticate(first.strip().splitlines()[-1]) is not None
    assert "exists" in second
    assert Membership.objects.get(user__username="admin").role == "admin"
    assert authenticate(username="admin", password="admin") is not None


def test_drf_create_token_gives_a_person_the_token_the_readme_says_the_api_takes(db, client):
    run("createorg", "acme")
    run("createreviewer", "acme", "alice", "--password", "s3cret-pass")

    token = run("drf_create_token", "alice").split()[2]  # "Generated token <key> for user alice"

    assert client.get("/api/v1/approvals", HTTP_AUTHORIZATION=f"Token {token}").status_code == 200
    replaced = run("drf_create_token", "-r", "alice").split()[2]
    assert replaced != token
    assert client.get("/api/v1/approvals", HTTP_AUTHORIZATION=f"Token {token}").status_code == 401
    assert client.get("/api/v1/approvals", HTTP_AUTHORIZATION=f"Token {replaced}").status_code == 200
