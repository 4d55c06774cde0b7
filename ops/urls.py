from django.urls import path

from ops import api

urlpatterns = [
    path("audit/export", api.AuditExportView.as_view(), name="audit-export"),
]
