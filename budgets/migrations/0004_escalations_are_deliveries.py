# Escalations are deliveries (purpose `escalation`); deliveries/0002 copied the rows.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('budgets', '0003_rule_refusals'),
        ('deliveries', '0002_copy_webhook_deliveries_and_escalations'),
    ]

    operations = [
        migrations.DeleteModel(
            name='Escalation',
        ),
    ]
