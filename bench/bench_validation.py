"""Validation cost per call, for a small and a large schema, valid and invalid arguments.

    python bench/bench_validation.py [--seconds 1.0] [--rounds 1]

Prints compile time per schema and, per case, validations per second and microseconds per validation (the full
path a call takes through ``CompiledSchema.validate``: size/depth measure, RE2 patterns, step budget, report).
Cases marked "jsonschema only" validate the same value with the fast path turned off (``fast.py``): the pair is
the fast path's gain. With ``--rounds`` above 1 every case is timed once per round, the cases interleaved, and
the range over the rounds is printed (the machine may be shared: compare ranges, not single figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator

from bastion.validation import SchemaLimits, compile_tool

SMALL = {"type": "object", "required": ["path"], "additionalProperties": False,
         "properties": {"path": {"type": "string", "maxLength": 4096}, "count": {"type": "integer", "maximum": 10}}}


# The official TypeScript SDK (zod) writes tool schemas in draft-07, input and output alike.
TS_SDK = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
          "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}

# What FastMCP / the Python SDK (pydantic) write: titles, defaults, Optional as anyOf with null, models in $defs.
PYDANTIC = {
    "type": "object", "title": "searchArguments", "required": ["query"],
    "properties": {
        "query": {"type": "string", "title": "Query"},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Limit"},
        "filter": {"anyOf": [{"$ref": "#/$defs/Filter"}, {"type": "null"}], "default": None},
        "mode": {"$ref": "#/$defs/Mode", "default": "fast"},
    },
    "$defs": {
        "Filter": {"type": "object", "title": "Filter", "additionalProperties": False,
                   "properties": {"tag": {"type": "string", "title": "Tag"}}},
        "Mode": {"enum": ["fast", "safe"], "title": "Mode", "type": "string"},
    },
}


def large_schema() -> dict[str, Any]:
    item = {"type": "object", "required": ["id", "name"], "additionalProperties": False,
            "properties": {"id": {"type": "string", "format": "uuid"},
                           "name": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9 _-]{0,63}$"},
                           "email": {"type": "string", "format": "email"},
                           "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 10},
                           "kind": {"enum": ["user", "group", "service"]},
                           "limits": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}}}
    properties: dict[str, Any] = {f"field_{i}": {"type": ["string", "null"], "maxLength": 256} for i in range(40)}
    properties["items"] = {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 500}
    properties["mode"] = {"oneOf": [{"const": "fast"}, {"const": "safe"}, {"type": "integer", "minimum": 1}]}
    return {"type": "object", "required": ["items"], "properties": properties,
            "$defs": {"tag": {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,31}$"}, "item": item}}


def large_arguments(items: int) -> dict[str, Any]:
    arguments: dict[str, Any] = {f"field_{i}": f"value {i}" for i in range(40)}
    arguments["mode"] = "safe"
    arguments["items"] = [{"id": "12345678-1234-5678-1234-567812345678", "name": f"Entry {n}",
                           "email": "a@example.org", "tags": ["alpha", "beta-2"], "kind": "user",
                           "limits": {"calls": 10, "bytes": 1000}} for n in range(items)]
    return arguments


def timed(fn: Callable[[], object], seconds: float) -> tuple[float, float]:
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(10):
            fn()
        count += 10
        now = time.perf_counter()
        if now >= deadline:
            elapsed = now - start
            return count / elapsed, elapsed / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    limits = SchemaLimits()
    large = large_schema()
    for name, schema in (("small", SMALL), ("large", large)):
        ops, us = timed(lambda schema=schema: compile_tool({"inputSchema": schema}, limits), args.seconds)
        print(f"compile {name:<5} schema: {us:10.1f} µs per compile")
    small_v = compile_tool({"inputSchema": SMALL}, limits).input
    large_v = compile_tool({"inputSchema": large}, limits).input
    ts_v = compile_tool({"inputSchema": TS_SDK}, limits).input
    pydantic_v = compile_tool({"inputSchema": PYDANTIC}, limits).input
    ts_slow = dataclasses.replace(ts_v, _fast=None)
    pydantic_slow = dataclasses.replace(pydantic_v, _fast=None)
    one_item = large_arguments(1)
    big_items = large_arguments(100)
    # Baseline: stock jsonschema, no RE2, no budget, no report; what the safety costs is the difference.
    stock = Draft202012Validator(large)
    bad_items = large_arguments(10)
    bad_items["items"][3]["kind"] = "robot"
    bad_items["items"][5]["id"] = "not-a-uuid"
    text = {"text": "hello, world"}
    search = {"query": "q", "limit": None, "filter": {"tag": "t"}, "mode": "safe"}
    cases: list[tuple[str, Callable[[], object]]] = [
        ("small schema, valid", lambda: small_v.validate({"path": "/tmp/x", "count": 3})),
        ("small schema, invalid", lambda: small_v.validate({"count": 30, "extra": True})),
        ("draft-07 (TS SDK), valid", lambda: ts_v.validate(text)),
        ("draft-07 (TS SDK), jsonschema only", lambda: ts_slow.validate(text)),
        ("pydantic anyOf/$ref, valid", lambda: pydantic_v.validate(search)),
        ("pydantic anyOf/$ref, jsonschema only", lambda: pydantic_slow.validate(search)),
        ("large schema, 1 item", lambda: large_v.validate(one_item)),
        ("large schema, 100 items", lambda: large_v.validate(big_items)),
        ("stock jsonschema, 100 items", lambda: list(stock.iter_errors(big_items))),
        ("large schema, 10 items, invalid", lambda: large_v.validate(bad_items)),
    ]
    for _, fn in cases:
        assert fn() is not None
    results: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in cases}
    for _ in range(args.rounds):
        for label, fn in cases:
            results[label].append(timed(fn, args.seconds))
    for label, runs in results.items():
        if len(runs) == 1:
            ops, us = runs[0]
            print(f"{label:<38} {ops:12,.0f} ops/s {us:10.1f} µs/validation")
        else:
            low, high = min(us for _, us in runs), max(us for _, us in runs)
            print(f"{label:<38} {low:10.1f} to {high:.1f} µs/validation over {len(runs)} rounds")


if __name__ == "__main__":
    main()
