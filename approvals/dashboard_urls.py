"""Dashboard pages (server-rendered)."""

from django.urls import path

from approvals import views

urlpatterns = [
    path("", views.queue, name="queue"),
]
