"""The gateway's TOML: what it accepts, and a clear error for what it cannot act on."""

from __future__ import annotations

import pytest

from undolog import CompensationDescriptor, ToolTier
from undolog.compensations import PermanentCompensationError, outcome
from undolog.gateway import ConfigError, parse_config
from undolog.gateway.core import tier_tool

BASE = {"servers": {"tracker": {"command": ["python", "tracker.py"], "trusted": True}}}


def with_tool(**tool) -> dict:
    return {
        "servers": {"tracker": {"command": "python tracker.py", "tools": {"create_issue": tool}}}
    }


class Tool:
    def __init__(self, name: str, **annotations) -> None:
        self.name, self.description, self.annotations = name, f"{name} things.", annotations or None


def test_it_reads_servers_overrides_and_defaults(monkeypatch):
    monkeypatch.setenv("DOCS_TOKEN", "s3cret")
    config = parse_config(
        {
            "undolog": {"agent": "desktop", "approval_wait_s": 5},
            "servers": {
                "tracker": {
                    "command": "python tracker.py",
                    "tools": {
                        "create_issue": {
                            "compensation": {
                                "tool": "close_issue",
                                "args": {"number": "{result.number}"},
                            }
                        }
                    },
                },
                "docs": {
                    "url": "https://mcp.example.com/mcp",
                    "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"},
                },
            },
        }
    )

    tracker, docs = config.servers
    assert tracker.command == ("python", "tracker.py") and not tracker.trusted
    assert docs.headers == {"Authorization": "Bearer s3cret"}
    assert (config.agent, config.approval_wait_s) == ("desktop", 5.0)
    compensation = tracker.tools["create_issue"].compensation
    assert compensation.function_name("tracker") == "mcp.tracker.close_issue"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({}, "no [servers.<name>] table"),
        ({"servers": {"t": {}}}, "exactly one of command"),
        ({"servers": {"t": {"command": "x", "url": "http://y"}}}, "exactly one of command"),
        ({"servers": {"t": {"command": "x", "trustd": True}}}, "unknown key(s) ['trustd']"),
        (with_tool(tier="compensable"), "a compensable tool needs compensation"),
        (with_tool(tier="sometimes"), "[servers.tracker.tools.create_issue]"),
        (with_tool(compensation={"args": {}}), "exactly one of tool"),
        (with_tool(approval={"risk_tags": []}), "[servers.tracker.tools.create_issue]"),
        (with_tool(compensation={"tool": "close_issue", "server": "trackr"}),
         "server = 'trackr' is not one of this file's servers (tracker)"),
        ({"servers": {"t": {"command": "x", "identity": "has spaces"}}}, "identity is 1 to 200"),
    ],
)
def test_it_refuses_what_it_cannot_act_on(data, says):
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert says in str(caught.value)


def test_a_compensation_makes_a_tool_compensable_and_a_tier_override_wins():
    server = parse_config(
        with_tool(compensation={"tool": "close_issue", "args": {"n": "{result.n}"}})
    ).servers[0]

    spec, _ = tier_tool(server, Tool("create_issue", destructiveHint=False), "create_issue")
    forced, why = tier_tool(
        parse_config(with_tool(tier="irreversible")).servers[0], Tool("create_issue"), "x"
    )

    assert (
        spec.tier is ToolTier.COMPENSABLE and spec.compensation.fn_name == "mcp.tracker.close_issue"
    )
    assert forced.tier is ToolTier.IRREVERSIBLE and forced.name == "x" and forced.approval.reason
    assert "config" in why


def test_an_untrusted_read_only_hint_earns_nothing():
    server = parse_config({"servers": {"t": {"command": "x"}}}).servers[0]
    trusted = parse_config(BASE).servers[0]

    assert (
        tier_tool(server, Tool("list", readOnlyHint=True), "list")[0].tier is ToolTier.IRREVERSIBLE
    )
    assert tier_tool(trusted, Tool("list", readOnlyHint=True), "list")[0].tier is ToolTier.SAFE


def test_result_paths_are_not_argument_names():
    descriptor = CompensationDescriptor.new(
        "close", {"n": "{result.number}", "r": "{repo}", "all": "{result}"}
    )

    assert descriptor.placeholders() == {"repo"}
    assert descriptor.result_paths() == {"number", ""}


def test_a_handler_outcome_says_ok_retry_or_permanent():
    assert outcome(None) == (True, "", False)
    assert outcome(ConnectionError("down")) == (False, "ConnectionError: down", False)
    assert outcome(PermanentCompensationError("gone"))[2] is True


class RecordingHttp:
    """Stands in for the server: records what the gateway registers."""

    base_url = "http://undolog.invalid"

    def __init__(self) -> None:
        self.sent: list = []

    async def asend(self, call):
        self.sent.append(call)
        return {}


def test_tools_two_servers_share_are_prefixed_with_their_server_name():
    import asyncio

    from undolog.gateway import Gateway

    config = parse_config({"undolog": {"agent": "desktop"}, "servers": {
        "github": {"command": "gh-mcp"}, "gitlab": {"command": "gl-mcp"}}})
    http = RecordingHttp()
    gateway = Gateway(config, http=http)
    gateway.listed = {"github": [Tool("create_issue"), Tool("star")],
                      "gitlab": [Tool("create_issue")]}

    asyncio.run(gateway._rebuild())

    assert set(gateway.routes) == {"github_create_issue", "gitlab_create_issue", "star"}
    assert gateway.routes["gitlab_create_issue"].upstream_name == "create_issue"
    registered = [tool["name"] for tool in http.sent[-1].body["tools"]]
    assert sorted(registered) == ["github_create_issue", "gitlab_create_issue", "star"]


def test_it_reads_client_tokens_from_the_environment_and_never_shows_them(monkeypatch):
    monkeypatch.setenv("ANA_TOKEN", "t" * 32)
    clients = {"ana": {"token": "${ANA_TOKEN}", "started_by": " ana@example.com "},
               "ci": {"token": "c" * 20}}
    config = parse_config({**BASE, "undolog": {"on_idle": "fail"}, "clients": clients})

    (ana, ci) = config.clients
    assert (ana.name, ana.token, ana.started_by) == ("ana", "t" * 32, "ana@example.com")
    assert (ci.name, ci.started_by) == ("ci", None)
    assert "t" * 32 not in repr(config) and "c" * 20 not in repr(config)
    assert config.on_idle == "fail"
    assert parse_config(BASE).on_idle == "complete" and parse_config(BASE).clients == ()


@pytest.mark.parametrize(
    ("clients", "says"),
    [
        ({"ana": {"token": "${UNSET_GATEWAY_TOKEN}"}}, "${UNSET_GATEWAY_TOKEN} is not set"),
        ({"ana": {"token": "$UNSET_GATEWAY_TOKEN-x"}}, "$UNSET_GATEWAY_TOKEN is not set"),
        ({"ana": {"token": "short"}}, "16 to 512 characters"),
        ({"ana": {}}, "16 to 512 characters"),
        ({"ana": {"token": 1234567890123456789}}, "16 to 512 characters"),
        ({"ana": {"token": "a" * 20}, "bo": {"token": "a" * 20}}, "share a token"),
        ({"ana": {"token": "a" * 20, "role": "admin"}}, "unknown key(s) ['role']"),
        ({"ana": {"token": "a" * 20, "started_by": ""}}, "started_by is a username"),
        ({"ana": "a" * 20}, "a table with token"),
    ],
)
def test_it_refuses_client_tokens_it_cannot_trust(monkeypatch, clients, says):
    monkeypatch.delenv("UNSET_GATEWAY_TOKEN", raising=False)
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, "clients": clients})
    assert says in str(caught.value)


def test_it_refuses_an_unknown_on_idle():
    with pytest.raises(ConfigError, match="on_idle: 'complete' or 'fail'"):
        parse_config({**BASE, "undolog": {"on_idle": "rollback"}})


def test_a_public_address_needs_client_tokens_and_loopback_does_not():
    from undolog.gateway.config import ClientConfig
    from undolog.gateway.server import InsecureBind, check_bind

    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"):
        check_bind(host, ())
    for host in ("0.0.0.0", "192.168.1.10", "gateway.example.com", "::"):
        with pytest.raises(InsecureBind, match=r"Add a \[clients\.<name>\] table"):
            check_bind(host, ())
    check_bind("0.0.0.0", (ClientConfig("ana", "a" * 20),))


def test_a_tool_table_sets_labels_and_untrusted_fields_for_run_aware_rules():
    config = parse_config(with_tool(labels=["untrusted", "private"], untrusted_fields=["body"]))
    spec, _ = tier_tool(config.servers[0], Tool("create_issue", readOnlyHint=True), "create_issue")

    assert spec.labels == ("untrusted", "private")
    assert spec.untrusted_fields == ("body",)
    with pytest.raises(ConfigError, match="labels must be a list of strings"):
        parse_config(with_tool(labels="untrusted"))


def test_an_upstreams_identity_is_where_it_is_and_never_its_credentials(monkeypatch):
    def scope(name="ledger", **spec) -> str:
        return parse_config({"servers": {name: spec}}).servers[0].scope

    monkeypatch.setenv("LEDGER_TOKEN", "one")
    here = scope(command=["npx", "ledger-mcp"], env={"LEDGER_TOKEN": "${LEDGER_TOKEN}"})
    assert here.startswith("mcp:ledger:") and len(here.rsplit(":", 1)[1]) == 16
    monkeypatch.setenv("LEDGER_TOKEN", "two")  # a rotated token: the same upstream
    assert scope(command=["npx", "ledger-mcp"], env={"LEDGER_TOKEN": "${LEDGER_TOKEN}"}) == here
    assert scope(command=["npx", "ledger-mcp"], cwd="/srv/other") != here
    assert scope(command=["npx", "other-mcp"]) != here
    assert scope("books", command=["npx", "ledger-mcp"]) != here
    assert scope(url="https://a.example/mcp", headers={"Authorization": "Bearer x"}) == scope(
        url="https://a.example/mcp", headers={"Authorization": "Bearer y"})
    assert scope(url="https://a.example/mcp") != scope(url="https://b.example/mcp")
    assert scope(command="npx ledger-mcp", identity="ledger-prod") == "ledger-prod"


def test_a_preset_and_a_per_tool_pre_image_make_tools_undone_by_pre_image():
    from undolog.gateway.preimages import declarations

    read = {"tool": "get_row", "args": {"id": "{id}"}}
    config = parse_config(
        {
            "servers": {
                "files": {"command": "npx server-filesystem /srv", "preset": "filesystem",
                          "tools": {"edit_file": {"tier": "irreversible"}}},
                "db": {"command": "db-mcp", "tools": {"update_row": {
                    "tier": "compensable",
                    "pre_image": {"before": read, "restore": {"tool": "put_row", "args": {}}}}}},
            }
        }
    )
    files, db = config.servers
    assert files.preset == "filesystem"
    # edit_file: its tier set by hand wins over the preset
    assert set(declarations(files)) == {"write_file", "move_file", "create_directory"}
    assert declarations(db)["update_row"]["before"] == read
    assert db.tools["update_row"].tier is None  # COMPENSABLE by its pre-image, no inverse needed


@pytest.mark.parametrize(
    "server, message",
    [
        ({"command": "x", "preset": "s3"}, "preset is one of"),
        ({"url": "https://mcp.example.com/mcp", "preset": "filesystem"}, "stdio server"),
        ({"command": "x", "tools": {"t": {"pre_image": "read first"}}}, "pre_image = "),
    ],
)
def test_a_bad_preset_or_pre_image_is_a_clear_config_error(server, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"servers": {"s": server}})


def test_a_tool_table_declares_what_a_request_says_to_ask_for_it():
    config = parse_config(with_tool(asked=["issue", "file a bug"]))
    spec, _ = tier_tool(config.servers[0], Tool("create_issue", readOnlyHint=True), "create_issue")

    assert spec.asked == ("issue", "file a bug")
    assert spec.to_dict()["asked"] == ["issue", "file a bug"]
    with pytest.raises(ConfigError, match="asked must be a list of strings"):
        parse_config(with_tool(asked="issue"))
