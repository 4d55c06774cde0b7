"""Budget policies, day counters and refusals (see budgets/README.md)."""
