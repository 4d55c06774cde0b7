# One retried-delivery mechanism: webhooks' events, executors, escalations and emails.

import django.db.models.deletion
import django.utils.timezone
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('approvals', '0002_decisions_and_webhooks'),
        ('effects', '0006_leaner_effect_and_undo_indexes'),
        ('orgs', '0005_outbox_and_run_idle_timeouts'),
    ]

    operations = [
        migrations.CreateModel(
            name='Delivery',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('purpose', models.CharField(choices=[('event', 'Event'), ('executor', 'Executor'), ('escalation', 'Escalation'), ('email', 'Email')], editable=False, max_length=16)),
                ('session_id', models.UUIDField(blank=True, editable=False, null=True)),
                ('kind', models.CharField(editable=False, help_text="The event kind, 'executor', or 'budget.exceeded' for an escalation.", max_length=64)),
                ('url', models.CharField(editable=False, help_text='Empty for an email.', max_length=500)),
                ('body', models.JSONField(editable=False)),
                ('timeout_ms', models.PositiveIntegerField(default=10000, editable=False)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('delivered', 'Delivered'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='pending', max_length=16)),
                ('attempts', models.PositiveSmallIntegerField(default=0)),
                ('max_attempts', models.PositiveSmallIntegerField(default=6)),
                ('next_attempt_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('claimed_at', models.DateTimeField(blank=True, null=True)),
                ('last_status_code', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True)),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('created', models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                ('agent', models.ForeignKey(blank=True, editable=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='orgs.agent')),
                ('effect', models.ForeignKey(blank=True, editable=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='effects.effect')),
                ('event', models.ForeignKey(blank=True, editable=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='orgs.event')),
                ('org', models.ForeignKey(editable=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='orgs.organization')),
                ('webhook', models.ForeignKey(blank=True, editable=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='approvals.orgwebhook')),
            ],
            options={
                'verbose_name_plural': 'deliveries',
                'ordering': ['-created'],
            },
        ),
        migrations.CreateModel(
            name='DeliveryAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveSmallIntegerField(editable=False)),
                ('started_at', models.DateTimeField(editable=False)),
                ('duration_ms', models.PositiveIntegerField(editable=False)),
                ('ok', models.BooleanField(editable=False)),
                ('status_code', models.PositiveSmallIntegerField(blank=True, editable=False, null=True)),
                ('error', models.TextField(blank=True, editable=False)),
                ('delivery', models.ForeignKey(editable=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempt_log', to='deliveries.delivery')),
            ],
            options={
                'ordering': ['delivery', 'number'],
            },
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(condition=models.Q(('state', 'pending')), fields=['next_attempt_at'], name='delivery_pending_due'),
        ),
        migrations.AddConstraint(
            model_name='delivery',
            constraint=models.UniqueConstraint(condition=models.Q(('purpose', 'event')), fields=('webhook', 'event'), name='delivery_once_per_hook_and_event'),
        ),
        migrations.AddConstraint(
            model_name='delivery',
            constraint=models.UniqueConstraint(condition=models.Q(('purpose', 'email')), fields=('event',), name='delivery_one_email_per_event'),
        ),
        migrations.AddConstraint(
            model_name='delivery',
            constraint=models.UniqueConstraint(condition=models.Q(('purpose', 'executor')), fields=('effect',), name='delivery_one_execution_per_effect'),
        ),
        migrations.AddConstraint(
            model_name='deliveryattempt',
            constraint=models.UniqueConstraint(fields=('delivery', 'number'), name='delivery_attempt_once_per_number'),
        ),
    ]
