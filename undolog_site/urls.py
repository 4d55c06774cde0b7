"""URL wiring: the API under /api/v1/, schema and docs, admin, login, health."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from approvals import slack
from core import errors
from ops import metrics as ops_metrics
from ops import views as ops_views
from orgs.login import ThrottledAdminAuthenticationForm, ThrottledLoginView
from undolog_site import health

admin.site.site_header = "undolog admin"
admin.site.site_title = "undolog admin"
admin.site.index_title = "Data of every organization (staff only; reviewers use the dashboard)"
# The app list beside every change list took a fifth of the width and clipped its last columns.
admin.site.enable_nav_sidebar = False
# Failed sign-ins are throttled per account and per address here as on /accounts/login/.
admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("api/v1/", include("effects.urls")),
    path("api/v1/", include("lifecycle.urls")),
    path("api/v1/", include("approvals.urls")),
    path("api/v1/", include("orgs.urls")),
    path("api/v1/", include("budgets.urls")),
    path("api/v1/", include("ops.urls")),
    re_path(r"^api/v1/", errors.api_not_found),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("healthz", health.healthz, name="healthz"),
    # Browsers ask every site for /favicon.ico (the API docs, the admin): answer, not a 404 each page.
    path("favicon.ico", RedirectView.as_view(url=static("undolog/favicon.svg"), permanent=True)),
    path("metrics", ops_metrics.view, name="metrics"),
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    # Slack's Request URL for an org's app: signed by Slack, not by a session or token.
    path("slack/interactions/<uuid:connection_id>", slack.interactions, name="slack-interactions"),
    path("audit/", ops_views.audit_page, name="audit-page"),
    path("", include("approvals.dashboard_urls")),
]
