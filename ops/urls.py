from django.urls import path

from ops import api

urlpatterns = [
    path("audit/export", api.AuditExportView.as_view(), name="audit-export"),
    path("org/retention", api.RetentionView.as_view(), name="org-retention"),
]
