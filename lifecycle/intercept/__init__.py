"""The intercept: one decision, and three paths that read and write it.

Shared by the paths (each module imports only those listed before it, and none imports a
path):

- `call`: the request validated by hand, and the call's signature (exactly-once's key).
- `rows`: what an admitted call writes, as values: its effect, a compensable call's undo entry,
  the agent context its approval request shows.
- `decision`: the one decision of a call that passed its budget and no deny rule: a grant, an
  approve rule, or how many people of which group (budgets before rules before this, always).
- `answers`: each outcome's status and body.
- `wire`: the fast paths' request (key, JSON body) and response, as the API reads and writes them.
- `sql`: the SQL the fast paths share: a row's shape, its INSERT from one jsonb parameter, a live
  key, the reported SAFE calls' insert. Running a statement is `core.prepared`'s.
- `config`: what the fast paths know of an org before any query, stamped with its config version.

The paths, each a module over those parts:

- `pipeline`: every call, through the ORM in one transaction; it owns every rule, and the fast
  paths give way to it for anything they do not take.
- `one_statement`: a compensable call within its run's limits, and a commit, in one statement
  each (`undolog_site.middleware.FastPathMiddleware`, before DRF); hands the calls the org's
  rules decide, and those reporting an output, to `two_statements`.
- `two_statements`: an irreversible call (or a compensable one the rules decide) in one read and
  one guarded write.
"""
