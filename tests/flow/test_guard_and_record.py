"""The policy guard reads a context only when a when-rule is about the call; the recorder writes after the call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from bastion.call import CallContext, CallRecord, Outcome
from bastion.errors import PolicyDenied
from bastion.flow import FlowRecorder, MemoryFlowStore, history_reader
from bastion.pipeline import Pipeline
from bastion.policy.flow import Touch
from bastion.policy.guard import PolicyGuard, PolicyHolder
from bastion.principal import Principal
from tests.policy.support import policy, tool

POLICY = """
version: 1
labels:
  - {labels: [private_data], tools: [files__read]}
  - {labels: [untrusted_content], tools: [web__fetch], touched_on: result}
  - {labels: [external_communication], tools: [mail__send]}
  - {labels: [unused], tools: ["*"]}
rules:
  - {id: all, effect: allow}
  - id: trifecta
    effect: deny
    reveal: true
    labels: [external_communication]
    when: {touched: [private_data, untrusted_content]}
"""


class CountingStore(MemoryFlowStore):
    """The real in-memory store, counting how often it is read and written."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.writes = 0

    async def history(self, context: str, since: float) -> tuple[Touch, ...]:
        self.reads += 1
        return await super().history(context, since)

    async def add(self, context: str, touches: Sequence[Touch], *, retention_s: float, max_touches: int) -> None:
        self.writes += 1
        await super().add(context, touches, retention_s=retention_s, max_touches=max_touches)


class BrokenStore(MemoryFlowStore):
    async def history(self, context: str, since: float) -> tuple[Touch, ...]:
        raise ConnectionError("redis down")


audits: list[CallRecord] = []


async def audit(ctx: CallContext, record: CallRecord, outcome: Outcome, result: dict[str, Any] | None,
                total_ms: float, *, error: BaseException | None = None) -> None:
    audits.append(record)


def pipeline(text: str, store: MemoryFlowStore) -> Pipeline:
    holder = PolicyHolder(policy(text))
    return Pipeline([PolicyGuard(holder, history_reader(store))], [],
                    FlowRecorder(audit, lambda: holder.current, store))


def ctx(name: str, n: int, session: str | None = "s1") -> CallContext:
    return CallContext(request_id=f"call-{n}", principal=Principal(id="alice", groups=frozenset()), tool=tool(name),
                       arguments={}, session_id=session)


def returning(result: dict[str, Any]) -> Any:
    async def forward(ctx: CallContext, record: CallRecord) -> dict[str, Any]:
        return result
    return forward


OK = returning({"content": [{"type": "text", "text": "ok"}]})
ERR = returning({"content": [{"type": "text", "text": "no"}], "isError": True})


async def test_no_when_rule_means_no_store_read_or_write() -> None:
    store = CountingStore()
    pipe = pipeline("version: 1\nlabels:\n  - {labels: [x]}\nrules:\n  - {id: all, effect: allow}\n", store)
    for i, name in enumerate(["files__read", "web__fetch", "mail__send"]):
        await pipe.run(ctx(name, i), OK)
    assert (store.reads, store.writes) == (0, 0)


async def test_only_calls_a_when_rule_is_about_read_and_only_watched_labels_are_written() -> None:
    store = CountingStore()
    pipe = pipeline(POLICY, store)
    await pipe.run(ctx("files__read", 1), OK)
    await pipe.run(ctx("web__fetch", 2), ERR)  # isError: touched_on result does not count it
    assert store.reads == 0 and store.writes == 1
    assert await pipe.run(ctx("mail__send", 3), OK)  # only private data so far
    assert store.reads == 1
    await pipe.run(ctx("web__fetch", 4), OK)
    with pytest.raises(PolicyDenied) as err:
        await pipe.run(ctx("mail__send", 5), OK)
    assert err.value.data is not None and err.value.data["touched"] == ["private_data", "untrusted_content"]
    chain = audits[-1].extra["flow"]["chain"]
    assert [(c["label"], c["call_id"]) for c in chain] == [("private_data", "call-1"), ("untrusted_content", "call-4")]
    history = await store.history("s:s1", 0)
    assert {t.label for t in history} == {"private_data", "untrusted_content"}  # never "unused"
    # Another session is its own context; no session (stateless era) is the principal's.
    assert await pipe.run(ctx("mail__send", 6, session="s2"), OK)
    assert await pipe.run(ctx("mail__send", 7, session=None), OK)


async def test_a_store_that_cannot_be_read_fails_closed_and_says_so() -> None:
    pipe = pipeline(POLICY, BrokenStore())
    with pytest.raises(PolicyDenied):
        await pipe.run(ctx("mail__send", 1), OK)
    assert audits[-1].extra["flow"] == {"history": "unavailable", "chain": []}
    assert await pipe.run(ctx("files__read", 2), OK)  # calls no when rule is about are unaffected
