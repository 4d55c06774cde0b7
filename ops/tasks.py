"""Periodic tasks: seal the audit chains, purge what is past retention. Both idempotent."""

from __future__ import annotations

import logging

from celery import shared_task

from ops import audit, retention
from orgs.models import Organization

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def seal_audit() -> int:
    sealed = sum(audit.seal(org_id) for org_id in audit.orgs_to_seal())
    logger.debug("audit: sealed %d record(s)", sealed)
    return sealed


@shared_task(ignore_result=True)
def purge() -> dict[str, int]:
    totals: dict[str, int] = {}
    for org in Organization.objects.all():
        for name, n in retention.purge(org).items():
            totals[name] = totals.get(name, 0) + n
    if any(totals.values()):
        logger.info("retention: archived and deleted %s", totals)
    return totals
