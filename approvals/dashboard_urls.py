"""Dashboard pages (server-rendered). Actions go through /api/v1/ from the pages' scripts."""

from django.urls import path

from approvals import views

urlpatterns = [
    path("", views.queue, name="queue"),
    path("orgs/", views.pick_org, name="pick-org"),
    path("approvals/<uuid:pk>/", views.approval_detail, name="approval"),
    path("sessions/", views.sessions, name="sessions"),
    path("sessions/<uuid:pk>/", views.session_detail, name="session"),
    path("agents/", views.agents, name="agents"),
    path("agents/<slug:name>/", views.agent_detail, name="agent"),
    path("compensation-failures/", views.compensation_failures, name="compensation-failures"),
    path("rules/", views.rules, name="rules"),
    path("settings/", views.org_settings, name="org-settings-page"),
    path("grants/", views.grants, name="grants"),
]
