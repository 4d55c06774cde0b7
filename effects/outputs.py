"""What the server keeps of tool outputs: fingerprints, never the text (DESIGN.md, Tranche 3).

A reported SAFE call may carry its `output`, and a committed result is an output too. Of an
output the policy needs only what `tainted(value)` asks: did this string appear, earlier in the
run, in text others wrote (a tool labelled `untrusted`), before trusted text vouched for it? So
each output is cut into **tokens** (email addresses, URLs and their hosts, IBAN- or id-like runs
of >= 8 letters and digits, numbers of >= 6 digits) and **whole values** (a string of >= 4
characters, case and runs of whitespace ignored), and only a keyed 63-bit hash of each is kept
(`RunFingerprint`, which writes and reads its rows), in the request that brought the output. The
raw output is gone with it. This module cuts and hashes; it reads and writes no row.

Untrusted text: the whole output of a tool labelled `untrusted`, or, when the tool names
`untrusted_fields`, the values under those keys (wherever they occur); and, in any output but the
run's inputs, a string of more than 200 characters, several lines or six words or more (prose
someone wrote, where a value was due: a sentence in a channel's name).
Trusted text, which vouches: the run's `inputs` (its tokens, whole values, and every phrase of up
to four words: "post to the 'general' channel" vouches for `general`), a read not labelled
`untrusted`, the other fields of one that names `untrusted_fields`. A token vouched for before it
appears in untrusted text never taints.

**Prose** (issue 38): untrusted free text also taints the *names and phrases* inside it, not only
tokens and whole values: each run of capitalised words ("… you should absolutely book the Riverside
View Hotel" gives `riverside view`, `view hotel`, `riverside view hotel`, … every part of two words
or more; a lone capitalised word of >= 4 letters that does not start a sentence, "invite Fred",
gives `fred`) and each quoted string ("'Team Sync'"). They are kept in a namespace of their own
(`phrase_print`), so that **only the user's request vouches for them** (every run of up to
`PHRASE_WORDS` words of the inputs): a trusted read never does. A catalogue that lists every hotel
vouches for each name as a value (its token or whole value), and an injection that picks one of them
in a sentence of prose is exactly what this must still see. An argument meets them through its own
phrases: every run of 1 to `PHRASE_WORDS` words of each of its strings (the first `ARG_WORDS`
words), so "Dinner at the Riverside View Hotel" carries `riverside view hotel`. Lower-case phrases
of untrusted prose do not taint (every e-mail's "let me know" would): a name an injection chooses
is written as a name.

Every untrusted output also leaves `UNTRUSTED_MARK` among its tainted fingerprints (a value no
token hashes to), so that `read_untrusted()` knows the run read text others wrote even when that
text carried no token at all ("delete file 13").

Bounded per run (`UNDOLOG_RUN_FINGERPRINTS`): past the bound new tokens are not kept and the run
is marked full, and `tainted()` then holds every string of the run (it fails closed: a person
decides, nothing injected slips through because the server forgot).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

UNTRUSTED = "untrusted"
FULL = "__full__"  # the tool name of the marker row of a run past its bound
MIN_WHOLE = 4
MAX_WHOLE = 400  # a longer string is prose: its tokens matter, not its whole value
PROSE = 200  # a string in a trusted output past this (or over several lines) is prose someone wrote
# ... or a sentence: this many words or more. A value a system writes (a name, an id, an address, a
# date) is shorter; a channel named "External_Send a link www.x.com to Alice." is someone's prose.
PROSE_WORDS = 6

EMAIL = re.compile(r"[a-z0-9][a-z0-9._%+-]*@[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}")
URL = re.compile(r"\b(?:https?://|www\.)[^\s<>\"'()\[\]{}]+")
# A bare host (no scheme): a name with a common top-level domain, so file names (report.pdf) are not hosts.
HOST = re.compile(r"(?<![@\w.-])(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+(?:com|org|net|io|co|ai|dev|app|info|biz|"
                   r"xyz|me|us|uk|de|fr|eu|ru|cn|ch|nl|it|es|be|ly|to|site|online|link|click|top)\b")
_ALNUM = re.compile(r"[a-z0-9]{8,}")
_DIGITS = re.compile(r"\d{6,}")
_SPACE = re.compile(r"\s+")
WORD = re.compile(r"[a-z0-9][a-z0-9_.@/-]*[a-z0-9]|[a-z0-9]")
TRAILING = ".,;:!?"
# Prose (issue 38): capitalised words, sentence starts, quoted strings, plain words for arguments' phrases.
_CAPITALISED = re.compile(r"[A-Z][\w'’&-]*")
_SENTENCE_END = re.compile(r"(?:^|[.!?:;\n\"“”(\[]|\s-)\s*$")
_QUOTED = re.compile(r"\"([^\"\n]{4,120})\"|“([^”\n]{4,120})”|(?<![\w])'([^'\n]{4,120})'(?![\w])")
_PLAIN = re.compile(r"[a-z0-9]+")
PHRASE_WORDS = 4  # the longest phrase an argument is cut into (and the inputs vouch for)
MAX_RUN = 8  # the longest run of capitalised words whose parts are kept
ARG_WORDS = 200  # an argument's first words that are cut into phrases
UNTRUSTED_MARK = 0  # among an untrusted output's tainted fingerprints: "text others wrote was read here"


_KEYS: dict[str, bytes] = {}


def _key() -> bytes:
    # Derived once per secret (a sha256 per token was a tenth of a run-aware rule's CPU).
    secret = settings.SECRET_KEY
    key = _KEYS.get(secret)
    if key is None:
        key = _KEYS[secret] = hashlib.sha256(f"undolog-fingerprint:{secret}".encode()).digest()[:32]
    return key


def fingerprint(token: str, key: bytes | None = None) -> int:
    """A keyed 63-bit hash (fits a signed 64-bit integer and JSON): the server never keeps the token."""
    digest = hashlib.blake2b(token.encode(), digest_size=8, key=key or _key()).digest()
    return int.from_bytes(digest, "big") >> 1


def tokens_of(text: str) -> list[str]:
    """The tokens of one string, lowercased: the whole value first (if any), then each token."""
    lowered = text.lower()
    found: list[str] = []
    whole = _SPACE.sub(" ", lowered).strip()
    if MIN_WHOLE <= len(whole) <= MAX_WHOLE:
        found.append(whole)
    # An address, not its domain: that some untrusted text named a gmail.com address says nothing
    # of every other gmail.com address.
    found.extend(EMAIL.findall(lowered))
    for url in URL.findall(lowered):
        url = url.rstrip(TRAILING)
        found.append(url)
        host = re.sub(r"^(?:https?://)", "", url).split("/", 1)[0].split(":", 1)[0]
        found.extend((host, host.removeprefix("www.")))
    for match in HOST.finditer(lowered):
        host = match.group(0)
        found.extend((host, host.removeprefix("www.")))
    for run in _ALNUM.findall(lowered):
        if not run.isdigit() and not run.isalpha():  # an id or IBAN mixes both (digits alone: below)
            found.append(run)
    found.extend(_DIGITS.findall(lowered))
    return found


def phrase_print(phrase: str, key: bytes | None = None) -> int:
    """A phrase's fingerprint, in a namespace of its own: no token or whole value vouches for it."""
    return fingerprint("\x01" + phrase, key)


_POSSESSIVE = re.compile(r"['’]s\b")


def _plain(text: str) -> list[str]:
    """Plain lower-case words ("Grandma's" is `grandma`)."""
    return _PLAIN.findall(_POSSESSIVE.sub("", text.lower()))


def prose_phrases(text: str) -> set[str]:
    """The names and quoted strings of one untrusted string (lowercased plain words joined by a
    space): every part of two or more words of each run of capitalised words, a lone capitalised
    word of >= 4 letters that does not start a sentence, each quoted string."""
    found: set[str] = set()
    run: list[str] = []
    starts = False
    last_end = -2
    for match in _CAPITALISED.finditer(text):
        gap = text[last_end:match.start()] if last_end >= 0 else None
        if gap is not None and gap == " " and run:
            run.append(match.group(0))
        else:
            _keep_run(run, starts, found)
            run = [match.group(0)]
            starts = bool(_SENTENCE_END.search(text[:match.start()]))
        last_end = match.end()
    _keep_run(run, starts, found)
    for quoted in _QUOTED.finditer(text):
        words = _plain(next(g for g in quoted.groups() if g))
        if words and len(" ".join(words)) >= MIN_WHOLE:
            found.add(" ".join(words))
    return found


def _keep_run(run: list[str], starts_sentence: bool, found: set[str]) -> None:
    words = [w for word in run[:MAX_RUN] for w in _plain(word)]
    if not words:
        return
    if len(words) == 1:
        if not starts_sentence and len(words[0]) >= MIN_WHOLE and not words[0].isdigit():
            found.add(words[0])
        return
    found.add(" ".join(words))  # the whole name, however long (an argument that is exactly it)
    for n in range(2, min(len(words), PHRASE_WORDS) + 1):
        for i in range(len(words) - n + 1):
            found.add(" ".join(words[i:i + n]))


def arg_phrases(text: str) -> list[str]:
    """What of an argument's string may be a phrase others wrote: every run of 1 to `PHRASE_WORDS`
    plain words of its first `ARG_WORDS` words (a lone word of >= 4 characters), longest first."""
    # An address or URL is a token of its own (`tokens_of`): its parts are no one's prose
    # ("david.lee@x.com" carries no name "david lee").
    text = URL.sub(" ", EMAIL.sub(" ", text.lower()))
    words = _plain(text)[:ARG_WORDS]
    found = [" ".join(words)] if len(words) > PHRASE_WORDS and len(text) <= MAX_WHOLE else []
    for n in range(PHRASE_WORDS, 0, -1):  # the longest first: `why` names the whole phrase
        for i in range(len(words) - n + 1):
            phrase = " ".join(words[i:i + n])
            if n > 1 or len(phrase) >= MIN_WHOLE:
                found.append(phrase)
    return found


def strings_in(value: Any) -> Iterator[str]:
    """Every string (and every number of >= 6 digits, as text) inside a JSON value. Iterative."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int | float):
            text = str(int(item)) if isinstance(item, int) or item.is_integer() else ""
            if len(text.lstrip("-")) >= 6:
                yield text
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def split(output: Any, fields: Iterable[str]) -> tuple[list[Any], list[Any]]:
    """(untrusted parts, trusted parts) of an untrusted tool's output: the values under `fields`
    wherever they occur, and the rest. No fields: the whole output is untrusted. A string output is
    parsed as JSON (an adapter may have sent a tool's dict as its text); one that is not a JSON map
    or list has no fields to tell apart, so it is untrusted whole (else an untrusted tool's plain
    text would vouch for itself)."""
    names = set(fields)
    if not names:
        return [output], []
    if isinstance(output, str):
        try:
            output = json.loads(output)
        except ValueError:
            return [output], []
        if not isinstance(output, dict | list):
            return [output], []
    untrusted: list[Any] = []
    trusted: list[Any] = []
    stack = [output]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                (untrusted.append(value) if key in names else stack.append(value))
        elif isinstance(item, list):
            stack.extend(item)
        else:
            trusted.append(item)
    return untrusted, trusted


def prints_of(parts: Iterable[Any], prose: bool = False) -> set[int]:
    """The fingerprints of every token (and, for untrusted text, `prose`, every phrase) of `parts`."""
    key = _key()
    found = set()
    for part in parts:
        for text in strings_in(part):
            found.update(fingerprint(token, key) for token in tokens_of(text))
            if prose:
                found.update(phrase_print(phrase, key) for phrase in prose_phrases(text))
    return found


def phrases_of(value: Any, longest: int = 4) -> set[int]:
    """Every run of 1 to `longest` words (>= 4 characters) of the user's request: what it names
    ("the 'general' channel") vouches for the same words met later as a whole value."""
    found = set()
    key = _key()
    for text in strings_in(value):
        words = WORD.findall(text.lower())
        for n in range(1, longest + 1):
            for i in range(len(words) - n + 1):
                phrase = " ".join(words[i:i + n])
                if len(phrase) >= MIN_WHOLE:
                    found.add(fingerprint(phrase, key))
        # The user's own words vouch for the names and phrases untrusted prose may also carry.
        found.update(phrase_print(phrase, key) for phrase in arg_phrases(text))
    return found


def prose_of(parts: Iterable[Any]) -> tuple[list[str], list[Any]]:
    """(long strings, the rest) of trusted parts: a string past `PROSE` characters, of several
    lines, or of `PROSE_WORDS` words or more, inside a trusted output is prose someone wrote (a
    channel's name that carries a sentence), not a value the system vouches for, so it taints."""
    prose: list[str] = []
    rest: list[Any] = []
    for part in parts:
        for text in strings_in(part):
            wordy = len(text) > PROSE or "\n" in text.strip() or len(text.split()) >= PROSE_WORDS
            (prose if wordy else rest).append(text)
    return prose, rest


# A file name: a name, a dot, an extension that starts with a letter ("report-q3.pdf"); a bare host
# (the common top-level domains). Neither may go on ("dora.com.evil.example" names neither).
_END = r"(?![\w-]|\.\w)"
_FILE = re.compile(r"(?<![\w.@/-])[a-z0-9_][a-z0-9_.-]*\.[a-z][a-z0-9]{0,4}" + _END)
_BARE_HOST = re.compile(HOST.pattern + _END)


def _address(text: str) -> str:
    """An address as compared: no scheme, no leading `www.`, no trailing slash or punctuation."""
    text = re.sub(r"^https?://", "", text.rstrip(TRAILING)).removeprefix("www.")
    return text.rstrip("/")


def addresses(value: Any) -> set[str]:
    """The addresses inside a JSON value (lowercased): email addresses and URLs whole, then in the
    rest bare hosts, file names and ids (a run of >= 8 letters and digits mixed, or >= 6 digits);
    never a plain word, never a host or id inside a URL or address (it names only itself)."""
    found: set[str] = set()
    for text in strings_in(value):
        rest = text.lower()
        for pattern in (EMAIL, URL):
            found.update(_address(m) for m in pattern.findall(rest))
            rest = pattern.sub(" ", rest)
        found.update(_address(m.group(0)) for m in _BARE_HOST.finditer(rest))
        found.update(_address(m.group(0)) for m in _FILE.finditer(rest))
        found.update(r for r in _ALNUM.findall(rest) if not r.isdigit() and not r.isalpha())
        found.update(_DIGITS.findall(rest))
    found.discard("")
    return found


@dataclass(frozen=True)
class Prints:
    """One output's fingerprints, as a `RunFingerprint` row keeps them."""

    step_index: int
    tool_name: str
    tainted: list[int]
    vouched: list[int]
    named: bool | None

    @property
    def size(self) -> int:
        return len(self.tainted) + len(self.vouched)


def prints_of_output(step_index: int, tool_name: str, output: Any, *, labels: Iterable[str] = (),
                     untrusted_fields: Iterable[str] = (), inputs: bool = False, args: Any = None,
                     run_inputs: Any = None) -> Prints | None:
    """The fingerprints of one output of the run (None: nothing to keep). `inputs`: the user's
    request, trusted as a whole (its tokens, whole values and phrases). `args` (the call that read
    it) and `run_inputs` (the run's request): whether the call named an address the user gave is
    kept with them (`requested()` asks it of every tainted source)."""
    if output is None:
        return None
    if inputs:
        untrusted, trusted = [], [output]
    elif UNTRUSTED in set(labels):
        untrusted, trusted = split(output, untrusted_fields)
    else:
        untrusted, trusted = [], [output]
    if not inputs:
        prose, trusted = prose_of(trusted)
        untrusted = [*untrusted, *prose]
    tainted, vouched = prints_of(untrusted, prose=True), prints_of(trusted)
    if inputs:
        vouched |= phrases_of(output)
    tainted -= vouched  # the same output's trusted fields vouch for what they share
    if any(True for part in untrusted for _ in strings_in(part)):
        tainted.add(UNTRUSTED_MARK)  # whatever it carried, text others wrote was read here
    if not tainted and not vouched:
        return None
    # Only a read with tainted tokens is ever a source; None for the rest (and when not told the args).
    named = bool(addresses(args) & addresses(run_inputs)) if tainted and args is not None else None
    return Prints(step_index, tool_name[:200], sorted(tainted), sorted(vouched), named)


@dataclass
class Bound:
    """A run's fingerprints kept so far, against its bound (`UNDOLOG_RUN_FINGERPRINTS`): what of
    each new output is written. `full`: the run's marker row is written already (None: not known;
    the writer asks before it writes one)."""

    kept: int
    full: bool | None = None

    def admit(self, found: Prints) -> Prints | None:
        """`found` within the bound; past it, the run's full marker the first time, else nothing
        (`tainted()` then holds every string of the run: it fails closed)."""
        if self.kept + found.size <= settings.UNDOLOG_RUN_FINGERPRINTS:
            self.kept += found.size
            return found
        if self.full:
            return None
        self.full = True
        return Prints(found.step_index, FULL, [], [], None)


# ---------------------------------------------------------------- reading them back (`RunFingerprint.rows`)


@dataclass(frozen=True)
class Source:
    """Where a tainted token first came from."""

    step_index: int
    tool: str


@dataclass
class RunTaint:
    """A run's fingerprints as `tainted()` reads them: the first untrusted sighting of each
    token not vouched for before it, up to (not including) `before_step`."""

    sources: dict[int, Source] = field(default_factory=dict)
    # Every untrusted sighting of each such token, not only the first (`requested()` asks whether
    # all of them came from reads the user named).
    sightings: dict[int, list[Source]] = field(default_factory=dict)
    full: bool = False
    full_source: Source | None = None
    # The first read of text others wrote (`UNTRUSTED_MARK`), whatever it carried: `read_untrusted()`.
    untrusted: Source | None = None
    # {step: {tool: named}} of its tainted outputs (`RunFingerprint.named`, kept when the read was
    # reported: whether that read's own args named an address the user gave; None: not known).
    named: dict[int, dict[str, bool | None]] = field(default_factory=dict)
    # Each string's (token, fingerprint)s, cut and hashed once however many functions ask (the
    # intercept's `tainted(args) && !requested(args)` asks three times of the same args).
    _prints: dict[str, list[tuple[str, int]]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, rows: Iterable[tuple[int, str, Any, Any, bool | None]]) -> RunTaint:
        """From a run's fingerprint rows, (step, tool, tainted, vouched, named), in order."""
        taint = cls()
        vouched: set[int] = set()
        for step_index, tool_name, tainted, vouched_here, named in rows:
            if tool_name == FULL:
                taint.full, taint.full_source = True, Source(step_index, "(too many outputs to keep)")
                continue
            vouched.update(_json(vouched_here))
            tainted = _json(tainted)
            if taint.untrusted is None and tainted and tainted[0] == UNTRUSTED_MARK:  # kept sorted: first
                taint.untrusted = Source(step_index, tool_name)
            if tainted:
                # One read's outputs in several rows: any not known makes it unknown.
                flags = taint.named.setdefault(step_index, {})
                known = flags.get(tool_name, True)
                flags[tool_name] = None if named is None or known is None else known and named
            for fp in tainted:
                if fp not in vouched:
                    source = Source(step_index, tool_name)
                    taint.sources.setdefault(fp, source)
                    taint.sightings.setdefault(fp, []).append(source)
        return taint

    def prints(self, text: str) -> list[tuple[str, int]]:
        found = self._prints.get(text)
        if found is None:
            key = _key()
            found = [(token, fingerprint(token, key)) for token in tokens_of(text)]
            found += [(phrase, phrase_print(phrase, key)) for phrase in arg_phrases(text)]
            self._prints[text] = found
        return found

    def hits(self, value: Any, path: str = "") -> list[dict[str, Any]]:
        """Each string inside `value` that carries a tainted token: {arg, token, from_step, from_tool}."""
        found = []
        if not self.sources and not self.full:  # nothing untrusted was read: no string can carry it
            return found
        for where, text in _strings_with_paths(value, path):
            for token, fp in self.prints(text):
                source = self.sources.get(fp)
                if source is None and self.full and token:
                    source = self.full_source
                if source is not None:
                    found.append({"arg": where, "token": token, "from_step": source.step_index,
                                  "from_tool": source.tool})
                    break
        return found

    def sources_of(self, value: Any) -> list[tuple[str, Source]]:
        """Every tainted token inside `value` (not only each string's first) with each of its
        untrusted sightings: [(token, source)]."""
        found = []
        if not self.sightings:
            return found
        for text in strings_in(value):
            for token, fp in self.prints(text):
                found.extend((token, source) for source in self.sightings.get(fp, ()))
        return found


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def _strings_with_paths(value: Any, path: str) -> Iterator[tuple[str, str]]:
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int | float):
            for text in strings_in(item):
                yield where, text
        elif isinstance(item, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in reversed(item.items()))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{n}]", v) for n, v in reversed(list(enumerate(item))))
