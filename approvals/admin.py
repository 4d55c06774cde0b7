from django import forms
from django.contrib import admin

from approvals.models import (
    ApprovalRequest,
    Grant,
    OrgWebhook,
    ReviewerGroup,
    Rule,
    RuleChange,
    SlackConnection,
    SlackMessage,
    SlackUserLink,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """History is written by the verbs and the worker, never edited by hand."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ["tool_name", "state", "timeout_at", "decided_by_label", "org", "created"]
    list_filter = ["state", "org"]
    search_fields = ["tool_name", "decided_by_label", "id"]
    readonly_fields = [f.name for f in ApprovalRequest._meta.fields]


@admin.register(OrgWebhook)
class OrgWebhookAdmin(admin.ModelAdmin):
    list_display = ["url", "org", "event_types", "slack", "active", "created"]
    list_filter = ["active", "slack", "org"]
    search_fields = ["url", "description", "org__slug"]


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    """Rules edited here are audited like the API's edits (a RuleChange and a rule.changed event)."""

    list_display = ["name", "org", "position", "outcome", "mode", "approvals_required", "agent", "tool", "updated"]
    list_filter = ["outcome", "mode", "org"]
    search_fields = ["name", "condition", "org__slug"]
    ordering = ["org", "position"]
    readonly_fields = ["updated", "updated_by"]

    def save_model(self, request, obj: Rule, form, change: bool) -> None:
        actor = f"admin:{request.user.get_username()}"
        if change:
            stored = Rule.objects.get(pk=obj.pk)
            stored.change({name: getattr(obj, name) for name in form.changed_data if name in Rule.FIELDS}, actor)
        else:
            obj.pk = Rule.add(obj.org, {name: getattr(obj, name) for name in Rule.FIELDS}, actor).pk

    def delete_model(self, request, obj: Rule) -> None:
        obj.remove(f"admin:{request.user.get_username()}")

    def delete_queryset(self, request, queryset) -> None:
        for rule in queryset:
            rule.remove(f"admin:{request.user.get_username()}")


class ReviewerGroupForm(forms.ModelForm):
    class Meta:
        model = ReviewerGroup
        fields = ["org", "name", "description", "members"]

    def clean(self):
        data = super().clean()
        org, members = data.get("org"), data.get("members") or []
        strangers = [str(m) for m in members if org is not None and m.org_id != org.pk]
        if strangers:
            raise forms.ValidationError({"members": f"Not members of {org}: {', '.join(strangers)}."})
        return data


@admin.register(ReviewerGroup)
class ReviewerGroupAdmin(admin.ModelAdmin):
    """Edited here like through the API: each edit is a reviewer_group.changed event (the audit
    chain seals it), and a group a rule or a pending request uses is not deleted."""

    form = ReviewerGroupForm
    list_display = ["name", "org", "description", "updated", "updated_by"]
    list_filter = ["org"]
    search_fields = ["name", "org__slug"]
    filter_horizontal = ["members"]
    readonly_fields = ["updated", "updated_by"]

    def save_model(self, request, obj: ReviewerGroup, form, change: bool) -> None:
        stored = ReviewerGroup.objects.filter(pk=obj.pk).first() if change else None
        # On the form, not on this admin (one instance serves every request): the settings before.
        form.before = None if stored is None else stored.settings()
        obj.updated_by = f"admin:{request.user.get_username()}"
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        group: ReviewerGroup = form.instance
        group.recorded(form.before, group.settings(), group.updated_by)

    def has_delete_permission(self, request, obj: ReviewerGroup | None = None) -> bool:
        return super().has_delete_permission(request, obj) and (obj is None or obj.in_use() is None)

    def delete_model(self, request, obj: ReviewerGroup) -> None:
        obj.remove(f"admin:{request.user.get_username()}")

    def delete_queryset(self, request, queryset) -> None:
        for group in queryset:
            if group.in_use() is None:
                group.remove(f"admin:{request.user.get_username()}")


@admin.register(RuleChange)
class RuleChangeAdmin(ReadOnlyAdmin):
    list_display = ["created", "org", "rule_name", "action", "actor", "changes"]
    list_filter = ["action", "org"]
    search_fields = ["rule_name", "actor"]


@admin.register(Grant)
class GrantAdmin(ReadOnlyAdmin):
    """Issued and revoked by reviewers (dashboard, API); read here."""

    list_display = ["tool_name", "agent", "session", "expires_at", "created_by_label", "revoked_at", "org", "created"]
    list_filter = ["org"]
    search_fields = ["tool_name", "agent__name", "id"]
    readonly_fields = [f.name for f in Grant._meta.fields]


class SlackConnectionForm(forms.ModelForm):
    """The secrets are write-only: blank keeps what is stored, and nothing stored is ever shown."""

    bot_token = forms.CharField(required=False, widget=forms.PasswordInput, help_text="xoxb-…; blank: unchanged.")
    signing_secret = forms.CharField(required=False, widget=forms.PasswordInput, help_text="Blank: unchanged.")

    class Meta:
        model = SlackConnection
        fields = ["org", "channel", "active"]

    def clean(self):
        data = super().clean()
        if self.instance._state.adding and not (data.get("bot_token") and data.get("signing_secret")):
            raise forms.ValidationError("Connecting Slack takes the bot token and the signing secret.")
        return data

    def save(self, commit: bool = True):
        self.instance.set_secrets(self.cleaned_data.get("bot_token"), self.cleaned_data.get("signing_secret"))
        return super().save(commit)


@admin.register(SlackConnection)
class SlackConnectionAdmin(admin.ModelAdmin):
    form = SlackConnectionForm
    list_display = ["org", "channel", "bot_token_hint", "active", "updated"]
    readonly_fields = ["bot_token_hint", "created"]


@admin.register(SlackUserLink)
class SlackUserLinkAdmin(admin.ModelAdmin):
    """An explicit link: this Slack user is this person (no verified email needed)."""

    list_display = ["slack_user", "user", "org", "learned", "created"]
    list_filter = ["learned", "org"]
    search_fields = ["slack_user", "user__username", "user__email"]


@admin.register(SlackMessage)
class SlackMessageAdmin(ReadOnlyAdmin):
    list_display = ["approval", "channel", "ts", "shown_state", "attempts", "last_error", "created"]
    readonly_fields = [f.name for f in SlackMessage._meta.fields]
