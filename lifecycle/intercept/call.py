"""An intercepted call as the server reads it: the body validated by hand (the hot path skips DRF's
serializers) and the call's signature, the key of exactly-once. Every path reads a call this way:
the pipeline, the one-statement and the two-statement paths (lifecycle/intercept/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from core.errors import Invalid
from effects import outputs
from effects.models import Session, Tool, canonical_json, sha256

ALLOWED_FIELDS = {"tool", "args", "step_index", "reasoning", "safe_calls", "idempotency_key"}
SAFE_CALL_FIELDS = {"tool", "step_index", "args", "output"}
NO_OUTPUT = object()  # a SAFE call reported without its output (an output may be null)
MAX_SAFE_CALLS = 1000
MAX_REASONING = 20_000


@dataclass
class ReportedSafeCall:
    tool: str
    step_index: int
    args: dict
    output: Any = NO_OUTPUT  # the tool's return value: only its fingerprints are kept (effects/outputs.py)

    def prints(self, tool: Tool | None, run_inputs: Any) -> outputs.Prints | None:
        """Its output's fingerprints, by its tool's labels (None: no output, or nothing in it to keep)."""
        if self.output is NO_OUTPUT:
            return None
        return outputs.prints_of_output(self.step_index, self.tool, self.output, labels=tool.labels if tool else (),
                                        untrusted_fields=tool.untrusted_fields if tool else (), args=self.args,
                                        run_inputs=run_inputs)


@dataclass
class Call:
    """A validated intercept request."""

    tool: str
    args: dict
    step_index: int
    reasoning: str = ""
    idempotency_key: str = ""
    safe_calls: list[ReportedSafeCall] = field(default_factory=list)
    args_json: str = ""  # canonical_json(args), written once: the size check, signature and digest read it

    def __post_init__(self) -> None:
        if not self.args_json:
            self.args_json = canonical_json(self.args)

    @property
    def args_digest(self) -> str:
        return sha256(self.args_json)


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**31 - 1


def _parse_safe_calls(raw: Any, errors: dict) -> list[ReportedSafeCall]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_SAFE_CALLS:
        errors["safe_calls"] = f"Must be a list of at most {MAX_SAFE_CALLS} {{tool, step_index, args}} objects."
        return []
    calls = []
    for n, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) - SAFE_CALL_FIELDS:
            errors[f"safe_calls[{n}]"] = "Must be an object with tool, step_index and optional args."
        elif (not isinstance(item.get("tool"), str) or not item["tool"] or len(item["tool"]) > 200
              or not _is_index(item.get("step_index"))):
            # 200: SafeCall.tool_name's column (PostgreSQL refuses longer; SQLite would not say)
            errors[f"safe_calls[{n}]"] = ("tool must be a non-empty string of at most 200 characters and "
                                          "step_index a non-negative integer.")
        elif not isinstance(item.get("args", {}), dict):
            errors[f"safe_calls[{n}]"] = "args must be an object."
        elif "output" in item and len(canonical_json(item["output"]).encode()) > settings.UNDOLOG_MAX_OUTPUT_BYTES:
            limit = settings.UNDOLOG_MAX_OUTPUT_BYTES // 1024
            errors[f"safe_calls[{n}].output"] = f"Must be at most {limit} KiB of JSON."
        else:
            calls.append(ReportedSafeCall(item["tool"], item["step_index"], item.get("args", {}),
                                          item.get("output", NO_OUTPUT)))
    return calls


def parse(data: Any) -> Call:
    """Validate the body by hand: the hot path skips DRF serializers."""
    if not isinstance(data, dict):
        raise Invalid({"non_field_errors": "The body must be a JSON object."}, "The body must be a JSON object.")
    errors: dict[str, str] = {}
    unknown = set(data) - ALLOWED_FIELDS
    if unknown:
        errors.update(dict.fromkeys(sorted(unknown), "Unknown field."))
    tool, args, step = data.get("tool"), data.get("args", {}), data.get("step_index")
    if not isinstance(tool, str) or not tool.strip() or len(tool) > 200:
        errors["tool"] = "A tool name (a non-empty string of at most 200 characters) is required."
    args_json = canonical_json(args) if isinstance(args, dict) else ""
    if not isinstance(args, dict):
        errors["args"] = "Must be a JSON object of the call's arguments."
    elif len(args_json.encode()) > settings.UNDOLOG_MAX_ARGS_BYTES:
        errors["args"] = f"Must be at most {settings.UNDOLOG_MAX_ARGS_BYTES // 1024} KiB of JSON."
    if not _is_index(step):
        errors["step_index"] = "A non-negative integer is required."
    reasoning, key = data.get("reasoning") or "", data.get("idempotency_key") or ""
    if not isinstance(reasoning, str) or len(reasoning) > MAX_REASONING:
        errors["reasoning"] = f"Must be a string of at most {MAX_REASONING} characters."
    if not isinstance(key, str) or len(key) > 200:
        errors["idempotency_key"] = "Must be a string of at most 200 characters."
    safe_calls = _parse_safe_calls(data.get("safe_calls"), errors)
    if errors:
        raise Invalid(errors, next(f"{k}: {v}" for k, v in errors.items()))
    return Call(tool=tool, args=args, step_index=step, reasoning=reasoning, idempotency_key=key,
                safe_calls=safe_calls, args_json=args_json)


def parse_safe_calls(data: Any) -> list[ReportedSafeCall]:
    """`safe_calls` sent with /complete or /fail: the run's last SAFE calls."""
    errors: dict[str, str] = {}
    calls = _parse_safe_calls(data, errors)
    if errors:
        raise Invalid(errors, next(f"{k}: {v}" for k, v in errors.items()))
    return calls


def call_signature(session: Session, call: Call) -> str:
    return signature_of(session.id, call)


def signature_of(session_id: Any, call: Call) -> str:
    if call.idempotency_key:
        return sha256(canonical_json([str(session_id), "idempotency_key", call.idempotency_key]))
    # canonical_json([str(session_id), call.tool, call.args]), with the args' part already written
    return sha256(f"[{canonical_json(str(session_id))},{canonical_json(call.tool)},{call.args_json}]")
