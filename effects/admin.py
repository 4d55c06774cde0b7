from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from effects.models import (
    CompensationFunction,
    Effect,
    EffectTransition,
    Session,
    Tool,
    UndoAttempt,
    UndoEntry,
)

RECENT = timedelta(days=7)


class ViewOnlyAdmin(admin.ModelAdmin):
    """The effect log and undo stacks are append-only history: their rows move only through the
    models' guarded transitions (the dashboard's and the API's actions), never by a form that
    saves whatever it was given. The admin shows them, with view permission only: no add, no
    change (the form has no Save), no delete (retention archives and deletes them)."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(CompensationFunction)
class CompensationFunctionAdmin(admin.ModelAdmin):
    """The compensation registry: a version is immutable once saved (a new version is a new row,
    validated as semver), a function in use cannot be deleted, and each shows how it fares."""

    list_display = ["fn_name", "fn_version", "handler", "target", "timeout_ms", "org", "attempts_7d",
                    "failure_rate_7d"]
    list_filter = ["handler", "org"]
    search_fields = ["fn_name", "fn_version", "target", "description", "org__slug"]
    readonly_fields = ["in_use_by", "recent_attempts"]

    def get_queryset(self, request):
        since = timezone.now() - RECENT
        recent = Q(undo_entries__attempt_log__started_at__gte=since)
        return super().get_queryset(request).select_related("org").annotate(
            recent_attempts_count=Count("undo_entries__attempt_log", filter=recent),
            recent_failures_count=Count("undo_entries__attempt_log", filter=recent & ~Q(
                undo_entries__attempt_log__outcome=UndoAttempt.Outcome.SUCCESS)),
        )

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return self.readonly_fields
        # Undo entries name the version they will run; editing it in place would rewrite history.
        return ["org", "fn_name", "fn_version", *self.readonly_fields]

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and obj.in_use():
            return False
        return super().has_delete_permission(request, obj)

    @admin.display(description="attempts (7 days)", ordering="recent_attempts_count")
    def attempts_7d(self, obj: CompensationFunction) -> int:
        return obj.recent_attempts_count

    @admin.display(description="failure rate (7 days)", ordering="recent_failures_count")
    def failure_rate_7d(self, obj: CompensationFunction) -> str:
        if not obj.recent_attempts_count:
            return "–"
        rate = obj.recent_failures_count / obj.recent_attempts_count
        return f"{rate:.0%} ({obj.recent_failures_count} of {obj.recent_attempts_count})"

    @admin.display(description="in use by")
    def in_use_by(self, obj: CompensationFunction) -> str:
        tools = list(obj.tools.values_list("name", flat=True)[:20])
        entries = obj.undo_entries.count()
        if not tools and not entries:
            return "nothing: it can be deleted"
        return f"tools: {', '.join(tools) or 'none'}; undo entries: {entries}"

    @admin.display(description="recent attempts")
    def recent_attempts(self, obj: CompensationFunction) -> str:
        attempts = (UndoAttempt.objects.filter(entry__fn=obj).select_related("entry")
                    .order_by("-started_at")[:20])
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ms</td><td>{}</td></tr>",
                                ((a.started_at.strftime("%Y-%m-%d %H:%M:%S"), a.entry_id, a.number, a.outcome,
                                  a.duration_ms, a.status_code or a.error[:200]) for a in attempts))
        if not rows:
            return "no attempts yet"
        return format_html("<table><tr><th>started</th><th>undo entry</th><th>attempt</th><th>outcome</th>"
                           "<th>duration</th><th>response or error</th></tr>{}</table>", rows)


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    list_display = ["name", "tier", "labels", "cost_weight", "irreversible", "compensation_fn", "org"]
    list_filter = ["tier", "irreversible", "org"]
    list_select_related = ["org", "compensation_fn"]
    search_fields = ["name", "description", "compensation_fn__fn_name", "org__slug"]
    autocomplete_fields = ["compensation_fn"]


class EffectTransitionInline(admin.TabularInline):
    model = EffectTransition
    extra = 0
    can_delete = False
    readonly_fields = ["from_state", "to_state", "actor", "reason", "created"]


@admin.register(Effect)
class EffectAdmin(ViewOnlyAdmin):
    list_display = ["tool_name", "tier", "state", "step_index", "session", "created"]
    list_select_related = ["session__agent"]
    list_filter = ["state", "tier"]
    search_fields = ["tool_name", "call_signature"]
    readonly_fields = [f.name for f in Effect._meta.fields]
    inlines = [EffectTransitionInline]


@admin.register(Session)
class SessionAdmin(ViewOnlyAdmin):
    """A run's state, counters and violation move only under the intercept's row lock and the
    session's guarded transitions (end, fail, halt, the walk); its effects and events hang off it,
    which a delete would cascade away. The admin shows it only."""

    list_display = ["id", "agent", "state", "step_index", "created"]
    list_filter = ["state"]
    list_select_related = ["agent"]
    readonly_fields = [f.name for f in Session._meta.fields]


class UndoAttemptInline(admin.TabularInline):
    model = UndoAttempt
    extra = 0
    can_delete = False
    readonly_fields = ["number", "started_at", "duration_ms", "outcome", "status_code", "error", "retry_delay_ms"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(UndoEntry)
class UndoEntryAdmin(ViewOnlyAdmin):
    """Retry and resolve by hand are on the dashboard (Failures) and the API: they move the
    entry and its walk together, which a saved form would not."""

    list_display = ["fn_name", "fn_version", "state", "attempts", "step_index", "session", "updated"]
    list_select_related = ["session__agent"]
    list_filter = ["state"]
    search_fields = ["fn_name", "=session__id", "=id"]
    readonly_fields = [f.name for f in UndoEntry._meta.fields]
    inlines = [UndoAttemptInline]
