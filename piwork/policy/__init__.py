"""Permission policy: rules, decisions, persistence and the audit log.

The gate extension in the guest classifies each tool call and asks through an
``extension_ui_request``; this package parses that request, decides it from
the persisted rules (or says "ask the person"), records answers, and builds
the reply. The wire format is in docs/permission-protocol.md.
"""

from piwork.policy.audit import AuditEntry, AuditLog, DecidedBy
from piwork.policy.decider import (
    Decider,
    Decision,
    TargetDecision,
    decide,
    describe_rules,
    needs_confirmation,
    proposed_rules,
    record_answer,
)
from piwork.policy.request import (
    GATE_CHOICES,
    Choice,
    PermissionPayloadError,
    PermissionRequest,
    build_cancel,
    build_reply,
    parse_request,
    validate_request,
)
from piwork.policy.rules import (
    DEFAULT_RULES,
    Action,
    Rule,
    RuleSource,
    Scope,
    ScopeKind,
    Target,
    TaskContext,
    Verdict,
    winning_rule,
)
from piwork.policy.store import PolicyDamaged, PolicyError, PolicyStore

__all__ = [
    "DEFAULT_RULES",
    "GATE_CHOICES",
    "Action",
    "AuditEntry",
    "AuditLog",
    "Choice",
    "DecidedBy",
    "Decider",
    "Decision",
    "PermissionPayloadError",
    "PermissionRequest",
    "PolicyDamaged",
    "PolicyError",
    "PolicyStore",
    "Rule",
    "RuleSource",
    "Scope",
    "ScopeKind",
    "Target",
    "TargetDecision",
    "TaskContext",
    "Verdict",
    "build_cancel",
    "build_reply",
    "decide",
    "describe_rules",
    "needs_confirmation",
    "parse_request",
    "proposed_rules",
    "record_answer",
    "validate_request",
    "winning_rule",
]
