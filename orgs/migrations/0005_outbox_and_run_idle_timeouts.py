# The outbox (Event.fanned_out_at) and abandoned runs (run_idle_timeout_s).
# Events recorded before this migration were fanned out in process when they committed:
# mark them so, or the outbox sweep would send the whole history again.

from django.db import migrations, models
from django.db.models import F


def mark_history_fanned_out(apps, schema_editor):
    apps.get_model("orgs", "Event").objects.filter(fanned_out_at__isnull=True).update(fanned_out_at=F("created"))


class Migration(migrations.Migration):

    dependencies = [
        ('orgs', '0004_quorum_by_risk_tag'),
    ]

    operations = [
        migrations.AddField(
            model_name='agent',
            name='run_idle_timeout_s',
            field=models.PositiveIntegerField(blank=True, help_text="This agent's runs: overrides the org's run_idle_timeout_s (0: never; empty: the org's).", null=True),
        ),
        migrations.AddField(
            model_name='event',
            name='fanned_out_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='organization',
            name='run_idle_timeout_s',
            field=models.PositiveIntegerField(default=3600, help_text='A running session silent this long is failed as abandoned (0: never). An agent may override it.'),
        ),
        migrations.AddIndex(
            model_name='event',
            index=models.Index(condition=models.Q(('fanned_out_at__isnull', True)), fields=['created'], name='event_undispatched'),
        ),
        migrations.RunPython(mark_history_fanned_out, migrations.RunPython.noop),
    ]
