"""Arrow schemas of the two tables every stage writes: documents and audit rows.

One place for the column lists, so a stage can never publish a shard whose
columns drift from what readers (`datasets`, the audit CLI, the trainer) expect.
"""
from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

DOC_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("url", pa.string(), nullable=False),
        pa.field("lang", pa.string(), nullable=True),
        pa.field("lang_score", pa.float32(), nullable=True),
        pa.field("meta", pa.string(), nullable=False),  # JSON object
    ]
)

AUDIT_ACTIONS = ("removed", "modified", "routed")

AUDIT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),  # removed | modified | routed
        pa.field("rule", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=True),
        pa.field("threshold", pa.float64(), nullable=True),
        pa.field("detail", pa.string(), nullable=False),  # JSON object
    ]
)


def dumps_json(obj: Any) -> str:
    """Canonical JSON used in `meta`/`detail` columns and for hashing: sorted keys, no spaces."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def docs_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Build a document table from dict rows; `meta` may be a dict or a JSON string."""
    cols: dict[str, list[Any]] = {f.name: [] for f in DOC_SCHEMA}
    for row in rows:
        for name in cols:
            value = row.get(name)
            if name == "meta":
                value = value if isinstance(value, str) else dumps_json(value or {})
            elif name in ("url", "text") and value is None:
                value = ""
            cols[name].append(value)
    return pa.Table.from_pydict(cols, schema=DOC_SCHEMA)


def audit_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Build an audit table from dict rows; `detail` may be a dict or a JSON string."""
    cols: dict[str, list[Any]] = {f.name: [] for f in AUDIT_SCHEMA}
    for row in rows:
        if row.get("action") not in AUDIT_ACTIONS:
            raise ValueError(f"audit row for {row.get('id')!r}: action must be one of {AUDIT_ACTIONS}, got {row.get('action')!r}")
        if not row.get("rule"):
            raise ValueError(f"audit row for {row.get('id')!r}: every decision needs a rule name")
        for name in cols:
            value = row.get(name)
            if name == "detail":
                value = value if isinstance(value, str) else dumps_json(value or {})
            elif name in ("value", "threshold") and value is not None:
                value = float(value)
            cols[name].append(value)
    return pa.Table.from_pydict(cols, schema=AUDIT_SCHEMA)
