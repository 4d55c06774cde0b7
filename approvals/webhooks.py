"""Moved to `core.outbound` (below every app, so effects and budgets need not import approvals).
These names stay importable from here for existing callers."""

from core.outbound import SIGNATURE_HEADER, TOLERANCE_S, Delivery, check_target, post, sign, verify

__all__ = ["SIGNATURE_HEADER", "TOLERANCE_S", "Delivery", "check_target", "post", "sign", "verify"]
