"""Run-aware conditions: what a rule may read of the run beyond the call itself (DESIGN.md, Tranche 3).

- `run.calls`: the run's earlier calls, `{tool, tier, labels, step_index, state}`, oldest first
  (SAFE ones as `reported`); `run.inputs`: what the user asked (`POST /sessions {"inputs"}`).
- `tainted(value)`: a string in `value` carries a token (or is a whole value) that appeared in
  untrusted output earlier in the run and was not vouched for first (effects/outputs.py). Every
  hit is kept for the approval's `why`: which argument, which token, from which step and tool.
- `window("24h").count(tool)` / `.sum(tool, "arg")`: the agent's approved or committed calls of
  `tool` in the last duration (`90s`, `30m`, `24h`, `7d`), this call excluded.
- `requested(args)`: the call is what the user asked for. At least one argument wholly is a value
  the user gave (its words appear, in order, in the run's `inputs`: "invite Dora" gives `Dora`), and
  every tainted token in the other arguments came only from reads the user named by an address
  (a URL, email address, file name or id that appears in the inputs: "her e-mail is on
  www.dora-website.com" names the `get_webpage` of that URL, so the address read there is what the
  user sent the agent to fetch). A plain word never names a read ("the channel general" does not
  vouch for what general contains); a tainted token also seen in any read the user did not name,
  a run past its fingerprint bound, a source step with no call: false. Nothing is kept for `why`
  (the `tainted(args)` beside it says which argument came from where).
- `read_untrusted()`: the run read text others wrote before this call (a read labelled `untrusted`
  reported with its output, or a trusted read's prose), whatever that text carried; `why` then names
  the first such read ("the run read untrusted text at step 3 (read_inbox)").
- `asked(tool)`: the user's request asks for this kind of action: one of the phrases the tool
  declares in `asked` (its registration) appears in the run's `inputs`, word by word (each word of
  the phrase begins a word of the request, in order: "pay" finds "payment", "change password"
  finds "change the password" no, "change password" yes). A tool that declares none is never asked.
  `why` then says so ("the request never asked for update_password (none of: password)").
- Helpers over text: `emails(text)`, `urls(text)`, `hosts(text)` (lists, lowercased), `lower(text)`,
  `domain(email_or_url)`.

Each is computed only when a rule of the org reads it, and at most once per call: a rule set
that reads none of them costs the intercept nothing more.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from effects import outputs
from effects.models import Effect, RunFingerprint, SafeCall, Tier, Tool

FUNCTIONS = frozenset({"tainted", "requested", "read_untrusted", "asked", "window", "count", "sum", "emails", "urls",
                       "hosts", "lower", "domain"})
# A free call of these with nothing to work on is a mistake the compiler cannot see (`tainted()`).
NEEDS_ARGUMENT = ("tainted", "requested", "asked", "window", "emails", "urls", "hosts", "lower", "domain")
_DURATION = re.compile(r"^\s*(\d{1,6})\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW = timedelta(days=90)
COUNTED = (Effect.State.APPROVED, Effect.State.EXECUTING, Effect.State.COMMITTED)


def duration(text: Any) -> timedelta:
    """`"24h"` → 24 hours; ValueError for anything else (or longer than 90 days)."""
    found = _DURATION.match(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"a window is a duration like \"30m\", \"24h\" or \"7d\", not {text!r}")
    span = timedelta(seconds=int(found.group(1)) * _UNITS[found.group(2)])
    if span > MAX_WINDOW:
        raise ValueError("a window is at most 90 days")
    return span


def emails(text: Any) -> list[str]:
    return list(dict.fromkeys(outputs.EMAIL.findall(str(text).lower())))


def urls(text: Any) -> list[str]:
    return list(dict.fromkeys(u.rstrip(outputs.TRAILING) for u in outputs.URL.findall(str(text).lower())))


def hosts(text: Any) -> list[str]:
    lowered = str(text).lower()
    found = [e.rsplit("@", 1)[1] for e in outputs.EMAIL.findall(lowered)]
    found += [re.sub(r"^https?://", "", u).split("/", 1)[0].split(":", 1)[0] for u in urls(lowered)]
    found += [m.group(0) for m in outputs.HOST.finditer(lowered)]
    return list(dict.fromkeys(h.removeprefix("www.") for h in found))


def domain(text: Any) -> str:
    found = hosts(text)
    return found[0] if found else ""


addresses = outputs.addresses


def _words(text: str) -> str:
    return " ".join(outputs.WORD.findall(text.lower()))


def _given(value: Any, said: list[str]) -> bool:
    """`value` wholly is something the user said: a string or number whose words appear in order in
    one of the inputs' strings (at least 4 characters of them), or a list of such values."""
    if isinstance(value, list):
        return bool(value) and all(_given(v, said) for v in value)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return False
    words = _words(str(value))
    if len(words) < outputs.MIN_WHOLE:
        return False
    return any(f" {words} " in text for text in said)


class RunView:
    """The run as one call's conditions see it: built lazily, each part at most once.

    `before_step` bounds what counts as "earlier" (the intercept: this call's step; the trial:
    the step of the call it replays), `moment` the end of a window, `exclude` this call's effect,
    `taint` the run's fingerprints before `step_index` when the caller has them (else read once)."""

    def __init__(self, session: Any, agent_id: Any, *, step_index: int, moment: datetime,
                 exclude: Any = None, args: dict[str, Any] | None = None,
                 taint: outputs.RunTaint | None = None) -> None:
        self.session, self.agent_id, self.step_index = session, agent_id, step_index
        self.args, self._arg_of = args, None
        self.moment, self.exclude = moment, exclude
        # Given when the caller read the run's fingerprints already (the fast approval path's one read).
        self._taint = taint
        self._windows: dict[tuple, Any] = {}
        self.hits: list[dict[str, Any]] = []
        # Why `requested()` said no while a rule was evaluated (reset per rule, as `hits`): for `why`.
        self.unrequested: str | None = None
        self._named: dict[int, str] | None = None
        # For `asked()` of the call's own tool (its declarations), and what it and `read_untrusted()`
        # found while a rule was evaluated (reset per rule, as `hits`): for `why`.
        self.tool: Any = None
        self.unasked: str | None = None
        self.untrusted_read: outputs.Source | None = None

    # ------------------------------------------------------------ variables

    def calls(self) -> list[dict[str, Any]]:
        effects = Effect.objects.filter(session_id=self.session.pk, step_index__lt=self.step_index)
        if self.exclude is not None:
            effects = effects.exclude(pk=self.exclude)
        rows = [(e.step_index, e.tool_name, e.tier, e.state) for e in
                effects.only("step_index", "tool_name", "tier", "state")]
        rows += [(s.step_index, s.tool_name, Tier.SAFE, "reported") for s in
                 SafeCall.objects.filter(session_id=self.session.pk, step_index__lt=self.step_index)
                 .only("step_index", "tool_name")]
        names = {name for _, name, _, _ in rows}
        labels = dict(Tool.objects.filter(org_id=self.session.org_id, name__in=names).values_list("name", "labels"))
        return [{"tool": name, "tier": tier, "labels": list(labels.get(name) or []), "step_index": step,
                 "state": state} for step, name, tier, state in sorted(rows, key=lambda r: r[0])]

    # ------------------------------------------------------------ functions

    def functions(self) -> dict[str, Any]:
        return {"tainted": self.tainted, "requested": self.requested, "read_untrusted": self.read_untrusted,
                "asked": self.asked, "window": self.window, "count": self.count,
                "sum": self.sum, "emails": emails, "urls": urls, "hosts": hosts, "lower": lambda t: str(t).lower(),
                "domain": domain}

    def taint(self) -> outputs.RunTaint:
        if self._taint is None:
            self._taint = outputs.RunTaint.of(RunFingerprint.rows(self.session.pk, before_step=self.step_index))
        return self._taint

    def tainted(self, value: Any) -> bool:
        found = self.taint().hits(value)
        if found and self.args is not None:
            # CEL hands over the value, not where it sits: name the argument that carries the token.
            if self._arg_of is None:
                self._arg_of = {}
                for hit in (found if value == self.args else self.taint().hits(self.args)):
                    self._arg_of.setdefault(hit["token"], hit["arg"])
            found = [{**hit, "arg": self._arg_of.get(hit["token"], hit["arg"])} for hit in found]
        self.hits.extend(found)
        return bool(found)

    def read_untrusted(self) -> bool:
        taint = self.taint()
        source = taint.untrusted or (taint.full_source if taint.full else None)
        if source is not None:
            self.untrusted_read = source
        return source is not None

    def asked(self, tool: Any) -> bool:
        """`tool`: the condition's `tool` (a map with its `asked`), or a tool's name."""
        name, phrases = self._declared(tool)
        if phrases and asked_in(phrases, self.session.inputs):
            return True
        self.unasked = (f"the request never asked for {name} (it says none of: {', '.join(phrases)})" if phrases
                        else f"the request never asked for {name} (the tool declares no asked words)")
        return False

    def _declared(self, tool: Any) -> tuple[str, list[str]]:
        if isinstance(tool, dict) or (hasattr(tool, "get") and not isinstance(tool, str)):
            return str(tool.get("name", "")), [str(p) for p in (tool.get("asked") or [])]
        name = str(tool)
        if self.tool is not None and name == self.tool.name:
            return name, list(self.tool.asked or [])
        found = Tool.objects.filter(org_id=self.session.org_id, name=name).values_list("asked", flat=True).first()
        return name, list(found or [])

    def requested(self, value: Any) -> bool:
        """See the module docstring. `value` a map: its entries are the arguments; else it is the one.
        Never raises: an error inside a condition is no match, and `!requested(...)` must then hold."""
        try:
            reason = self._requested(value)
        except Exception:
            reason = "it could not be decided"
        if reason:
            self.unrequested = reason
        return not reason

    def _requested(self, value: Any) -> str:
        """"" when requested, else why not (what the reviewer reads)."""
        arguments = list(value.values()) if isinstance(value, dict) else [value]
        inputs = self.session.inputs
        said = [f" {_words(text)} " for text in outputs.strings_in(inputs)]
        given = [_given(v, said) for v in arguments]
        if not any(given):
            return "no argument is something the user asked for"
        taint = self.taint()
        if taint.full:
            return "the run read more than the server keeps"
        found = [source for v, ok in zip(arguments, given, strict=True) if not ok
                 for _, source in taint.sources_of(v)]
        if not found:
            return ""
        named = self._named_reads({source.step_index for source in found})
        unnamed = [source for source in found if named.get(source.step_index) != source.tool]
        if unnamed:
            return f"it came from {unnamed[0].tool} at step {unnamed[0].step_index}, a read the user did not name"
        return ""

    def _named_reads(self, steps: set[int]) -> dict[int, str]:
        """{step: tool} of the run's earlier reads at `steps` whose args named an address the user
        gave; "" for any other step. Whether a read named one was kept with its fingerprints when it
        was reported (`RunFingerprint.named`, that read's own args); only for a step without it (a
        row written before it was kept, a committed result) or with two tainted reads are the args
        read and compared here (one query, for the steps not asked before), where one call a step
        is the rule: none, or two at one step (a SAFE call and an effect), is unclear."""
        if self._named is None:
            self._named = {}
        missing = {step for step in steps if step not in self._named and step < self.step_index}
        taint = self.taint()
        unknown: set[int] = set()
        for step in missing:
            flags = taint.named.get(step, {})
            if len(flags) == 1 and None not in flags.values():
                ((tool, named),) = flags.items()
                self._named[step] = tool if named else ""
            else:
                unknown.add(step)
        if unknown:
            addressed = addresses(self.session.inputs)
            calls: dict[int, list[tuple[str, Any]]] = {}
            for step, tool, args in _calls_at(self.session.pk, sorted(unknown)) if addressed else ():
                calls.setdefault(step, []).append((tool, args))
            for step in unknown:
                found = calls.get(step, [])
                self._named[step] = found[0][0] if len(found) == 1 and addresses(found[0][1]) & addressed else ""
        return self._named

    def window(self, span: Any) -> dict[str, Any]:
        return {"window_s": int(duration(span).total_seconds())}

    def count(self, window: Any, tool: Any) -> int:
        return len(self._calls_in(window, tool))

    def sum(self, window: Any, tool: Any, arg: Any) -> int | float:
        """An int while every amount is one (CEL adds no int to a double: `+ args.amount` must
        meet its own type), else a double."""
        values = [args.get(arg) for args in self._calls_in(window, tool) if isinstance(args, dict)]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        total = sum(numbers)
        return total if all(isinstance(v, int) for v in numbers) else float(total)

    def _calls_in(self, window: Any, tool: Any) -> list[Any]:
        if not isinstance(window, dict) or "window_s" not in window or not isinstance(tool, str):
            raise ValueError("count and sum are read off a window: window(\"24h\").count(\"refund\")")
        key = (window["window_s"], tool)
        if key not in self._windows:
            since = self.moment - timedelta(seconds=window["window_s"])
            rows = Effect.objects.filter(session__agent_id=self.agent_id, tool_name=tool, state__in=COUNTED,
                                         created__gte=since, created__lte=self.moment)
            if self.exclude is not None:
                rows = rows.exclude(pk=self.exclude)
            self._windows[key] = [approved if approved is not None else args
                                  for args, approved in rows.values_list("args", "approved_args")]
        return self._windows[key]


def _plain(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def asked_in(phrases: list[str], inputs: Any) -> bool:
    """Whether one of `phrases` appears in a string of `inputs`: its words, in order and next to each
    other, each beginning a word of the request ("pay" finds "Payment", "book" finds "booking")."""
    said = [_plain(text) for text in outputs.strings_in(inputs)]
    for phrase in phrases:
        words = _plain(phrase)
        if not words:
            continue
        for text in said:
            for i in range(len(text) - len(words) + 1):
                if all(text[i + n].startswith(word) for n, word in enumerate(words)):
                    return True
    return False


def _calls_at(session_id: Any, steps: list[int]) -> list[tuple[int, str, Any]]:
    """(step, tool, args) of a run's SAFE calls and effects at `steps`: one statement, written out
    (the ORM's UNION cost ~1 ms of CPU to compile, six times the query; this is on the intercept)."""
    quote = connection.ops.quote_name
    session = Effect._meta.get_field("session").target_field.get_db_prep_value(session_id, connection)
    marks = ", ".join(["%s"] * len(steps))
    selects = []
    for model in (SafeCall, Effect):
        column = {name: quote(model._meta.get_field(name).column) for name in ("session", "step_index", "tool_name",
                                                                                  "args")}
        selects.append(f"SELECT {column['step_index']}, {column['tool_name']}, {column['args']} "
                       f"FROM {quote(model._meta.db_table)} WHERE {column['session']} = %s "
                       f"AND {column['step_index']} IN ({marks})")
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(selects), [session, *steps, session, *steps])
        rows = cursor.fetchall()
    # JSON comes back as text on both backends (Django loads jsonb as text and parses it in the field).
    return [(step, tool, json.loads(args) if isinstance(args, str | bytes) else args) for step, tool, args in rows]
