# WebhookDelivery and DeliveryAttempt became deliveries.Delivery and DeliveryAttempt: their rows
# were copied by deliveries/0002 (same ids, so Idempotency-Keys and links stay); drop the old tables.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0005_slack'),
        ('deliveries', '0002_copy_webhook_deliveries_and_escalations'),
    ]

    operations = [
        migrations.DeleteModel(name='DeliveryAttempt'),
        migrations.DeleteModel(name='WebhookDelivery'),
    ]
