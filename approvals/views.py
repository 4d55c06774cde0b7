"""The reviewer dashboard: server-rendered pages that read with a fixed number of queries.

Pages only READ (scoped to the reviewer's org, see `approvals/dashboard.py`); every action
goes through the REST API from the page's JavaScript, so the API's permission checks and
error messages are the only ones. A user in several orgs picks one; the choice lives in
the session under "org" (the API's `caller_of` reads the same key).
"""

from __future__ import annotations

from functools import wraps
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods

from approvals import charts, dashboard, rules_page, slack
from orgs.auth import resolve_membership
from orgs.models import Membership

ORG_SESSION_KEY = "org"
# The last org a person chose, kept past logout in this browser (a slug, nothing secret): a person
# in two orgs (admin after `make demo`) is not stopped at "Choose an organization" on every visit.
LAST_ORG_COOKIE = "undolog_org"
LAST_ORG_MAX_AGE_S = 365 * 86400


def current_membership(request: HttpRequest) -> Membership | None:
    """The membership of the org chosen in this session, else the one last chosen in this
    browser; the only one if there is one. One query (two when the chosen org is no longer the
    person's). `orgs.auth.resolve_membership` decides, as it does for the API and the websocket."""
    slug = request.session.get(ORG_SESSION_KEY) or request.COOKIES.get(LAST_ORG_COOKIE)
    membership, _ = resolve_membership(request.user, slug)
    if membership is None and slug:
        request.session.pop(ORG_SESSION_KEY, None)  # removed from that org since: choose again
        membership, _ = resolve_membership(request.user, None)
    if membership is not None and ORG_SESSION_KEY not in request.session:
        request.session[ORG_SESSION_KEY] = membership.org.slug
    return membership


def member_page(view):
    """Log in, then be a member (viewer and up) of the chosen org; pass the membership on."""

    @wraps(view)
    @login_required
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        membership = current_membership(request)
        if membership is None:
            return HttpResponseRedirect(f"{reverse('pick-org')}?{urlencode({'next': request.get_full_path()})}")
        request.membership = membership
        return view(request, membership, *args, **kwargs)

    return wrapper


def page(request: HttpRequest, membership: Membership, template: str, context: dict,
         *, partial: str | None = None, nav_pending: int | None = None) -> HttpResponse:
    """Render a page with what every page shows (nav count, incident banner, role flags), or
    with `?part=live` only the fragment the page's script swaps in on a live update."""
    if partial and request.GET.get("part") == "live":
        # The whole page renders inside {% timezone org.time_zone %} (base.html); so must its fragment.
        with timezone.override(membership.org.tz):
            return render(request, partial, {**context, **dashboard.roles(membership)})
    return render(request, template, {**dashboard.frame(membership, nav_pending), **context})


@login_required
@require_http_methods(["GET", "POST"])
def pick_org(request: HttpRequest) -> HttpResponse:
    memberships = list(Membership.objects.select_related("org").filter(user=request.user).order_by("org__name"))
    target = request.POST.get("next") or request.GET.get("next") or "/"
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        target = "/"
    error, status = "", 403 if not memberships else 200
    if request.method == "POST":
        slug = request.POST.get("org", "")
        if any(m.org.slug == slug for m in memberships):
            request.session[ORG_SESSION_KEY] = slug
            response = HttpResponseRedirect(target)
            response.set_cookie(LAST_ORG_COOKIE, slug, max_age=LAST_ORG_MAX_AGE_S, httponly=True, samesite="Lax",
                                secure=request.is_secure())
            return response
        error, status = "You are not a member of that organization; pick one of yours.", 400
    return render(request, "approvals/pick_org.html",
                  {"memberships": memberships, "next": target, "error": error,
                   "current": request.session.get(ORG_SESSION_KEY)}, status=status)


@require_GET
@member_page
def queue(request: HttpRequest, membership: Membership) -> HttpResponse:
    org = membership.org
    stats = dashboard.queue_stats(org)
    card = {"stats": stats, "decided_chart": charts.decisions_per_day(stats["per_day"]),
            "median_to_decide": charts.duration(stats["median_time_to_decide_s"])}
    if request.GET.get("part") == "live":  # the "Last 7 days" card, re-rendered after each decision
        return page(request, membership, "approvals/queue.html", card, partial="approvals/_queue_stats.html")
    listing = dashboard.queue_listing(org, request.GET)
    return page(request, membership, "approvals/queue.html", {
        **card, "listing": listing, "approvals": listing.pending, "empty_row": dashboard.empty_queue_row(),
    }, nav_pending=stats["pending"])


@require_GET
@member_page
def approval_detail(request: HttpRequest, membership: Membership, pk) -> HttpResponse:
    approval = get_object_or_404(dashboard.approvals_of(membership.org), pk=pk)
    context = dashboard.approval_context(approval)
    context["in_group"] = approval.in_group(request.user)  # may approve for its reviewer group (if any)
    return page(request, membership, "approvals/approval.html", context, partial="approvals/_approval_live.html")


@require_GET
@member_page
def sessions(request: HttpRequest, membership: Membership) -> HttpResponse:
    listing = dashboard.session_list(membership.org, request.GET)
    return page(request, membership, "approvals/sessions.html", {"listing": listing})


@require_GET
@member_page
def session_detail(request: HttpRequest, membership: Membership, pk) -> HttpResponse:
    session = get_object_or_404(dashboard.sessions_of(membership.org), pk=pk)
    return page(request, membership, "approvals/session.html", dashboard.session_context(session),
                partial="approvals/_session_live.html")


@require_GET
@member_page
def agents(request: HttpRequest, membership: Membership) -> HttpResponse:
    context = dashboard.agents_context(membership.org, with_keys=membership.has_role(Membership.Role.ADMIN))
    for row in context["agents"]:
        row["charts"] = charts.runs_against_cap(row["runs_per_day"], row["caps"])
    return page(request, membership, "approvals/agents.html", context, partial="approvals/_agents_live.html")


@require_GET
@member_page
def agent_detail(request: HttpRequest, membership: Membership, name: str) -> HttpResponse:
    context = dashboard.agent_page(membership.org, name)
    if context is None:
        raise Http404(f"No agent named {name!r} in this organization.")
    return page(request, membership, "approvals/agent.html", context, partial="approvals/_agent_live.html")


@require_GET
@member_page
def compensation_failures(request: HttpRequest, membership: Membership) -> HttpResponse:
    return page(request, membership, "approvals/failures.html",
                {"listing": dashboard.compensation_failures(membership.org, request.GET)},
                partial="approvals/_failures_live.html")


@require_GET
@member_page
def org_settings(request: HttpRequest, membership: Membership) -> HttpResponse:
    is_admin = membership.has_role(Membership.Role.ADMIN)
    return page(request, membership, "approvals/settings.html",
                dashboard.settings_context(membership.org, with_webhooks=is_admin,
                                           slack_url=lambda connection: slack.interactions_url(connection, request)))


@require_GET
@member_page
def rules(request: HttpRequest, membership: Membership) -> HttpResponse:
    return page(request, membership, "approvals/rules.html", rules_page.rules_context(membership.org))


@require_GET
@member_page
def grants(request: HttpRequest, membership: Membership) -> HttpResponse:
    return page(request, membership, "approvals/grants.html", {"grants": dashboard.grants_of(membership.org)})
