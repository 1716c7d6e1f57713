"""Forwarding a request to its upstream, across the rounds of a multi round-trip request (2026-07-28).

A 2026-07-28 server that needs something from the client (an elicitation, a sampling, the roots) answers
``input_required`` with its questions and an opaque ``requestState``; the client answers and retries with both.
bastion sits between two parties that may be of different eras, so it bridges:

- a **modern client** gets the upstream's questions back (cleaned), with the upstream's state sealed inside
  bastion's own ``requestState`` (``server/state.py``): a retry is verified (principal, request, expiry, upstream)
  before anything reaches the upstream, which then gets its own state back, byte-exact;
- a **handshake-era client** cannot retry: bastion asks it each question on the call's SSE stream, as the
  server-to-client requests that era knows, and retries the upstream itself, within one call.

bastion's own approval question (an ``approve`` policy rule, ``bastion.approvals``) rides the same mechanism under
its own input key, so the upstream never sees it. The envelope bastion forwards (trace context, progress token,
and for a modern upstream the input capabilities and log level of this caller) is built here too, because it is
per round: it is rebuilt for every retry rather than copied from the client.

Kept apart from the method table (``server/dispatch.py``) because only three methods take rounds (``tools/call``,
``prompts/get``, ``resources/read``) and this is the only code that holds state across HTTP requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, cast

import structlog

from bastion import jsonrpc
from bastion.call import ApprovalRound
from bastion.errors import INTERNAL_ERROR, MISSING_CLIENT_CAPABILITY, ProtocolError, ToolError
from bastion.gateway import Gateway
from bastion.protocol.messages import InputRequiredResult, RoundParams
from bastion.protocol.meta import CLIENT_CAPABILITIES_KEY, LOG_LEVEL_KEY
from bastion.protocol.methods import ELICITATION, INPUT_CAPABILITY
from bastion.server.emitter import NullEmitter
from bastion.server.eras import is_input_required, undeclared_inputs
from bastion.server.relay import RelayHandler
from bastion.server.scope import Scope
from bastion.server.state import InvalidRequestState, RoundTrip, StateSealer, request_digest

__all__ = ["APPROVAL_INPUT_KEY", "MAX_INPUT_ROUNDS", "Rounds", "approval_question", "approval_round"]

log = structlog.get_logger("bastion.dispatch")

# Client _meta keys passed on to upstreams; a client's own envelope (version, identity) never is.
FORWARDED_META = ("progressToken", "traceparent", "tracestate")
# Rounds of input bastion fetches from a handshake-era client for one call before giving up on the upstream.
MAX_INPUT_ROUNDS = 10
# The inputRequests key of bastion's own approval question (2026-07-28); upstream keys never reach bastion's.
APPROVAL_INPUT_KEY = "bastion-approval"


class Rounds:
    """Forwards requests for the ``Dispatcher`` and bridges ``input_required`` between the eras."""

    def __init__(self, gateway: Gateway, sealer: StateSealer) -> None:
        self.gw = gateway
        self.sealer = sealer

    def upstream_is_modern(self, upstream: str) -> bool:
        info = self.gw.pool.member(upstream).upstream.info
        return info is not None and info.era == "modern"

    def open(self, scope: Scope, method: str, target: str, params: RoundParams, upstream: str) -> RoundTrip | None:
        """Verify the ``requestState`` of a retried request; ``None`` for a first request."""
        state = params.get("requestState")
        if state is None:
            # Nothing of bastion's to verify: a first request. Stray inputResponses go to the upstream unchanged
            # (the client could send them there directly); it ignores them or asks again.
            return None
        try:
            trip = self.sealer.open(state, principal_id=scope.principal.id,
                                    digest=request_digest(method, target, params), now=time.time())
            if trip.upstream != upstream:
                raise InvalidRequestState("issued for a request another upstream served")
        except InvalidRequestState as exc:
            log.info("request_state.refused", method=method, target=target[:200], principal=scope.principal.id,
                     reason=exc.log_detail)
            raise
        return trip

    def _forward_meta(self, scope: Scope, upstream: str, meta: Mapping[str, Any], *,
                      rounds: bool = True) -> dict[str, Any]:
        """The ``_meta`` bastion sends upstream: trace context and progress token, plus, for a modern upstream,
        the input capabilities bastion can relay for this caller (so the upstream asks only for what it can get;
        none for a request that takes no rounds).
        """
        out = {k: meta[k] for k in FORWARDED_META if k in meta}
        if "traceparent" not in out and scope.traceparent is not None:
            # A client that traces at the HTTP layer only: its context still reaches the upstream (when bastion
            # traces, ``Tracing.forward`` replaces it with bastion's own client span).
            out["traceparent"] = scope.traceparent
            if scope.tracestate is not None:
                out["tracestate"] = scope.tracestate
        if self.upstream_is_modern(upstream):
            relayable = rounds and (scope.era == "modern" or not isinstance(scope.emitter, NullEmitter))
            out[CLIENT_CAPABILITIES_KEY] = {k: v for k, v in scope.client_capabilities.items()
                                            if k in INPUT_CAPABILITY.values()} if relayable else {}
            # A modern upstream logs only when the request asks; a handshake-era client without a floor gets
            # everything (its era's default), so bastion asks for everything on its behalf.
            level = scope.log_level or ("debug" if scope.era == "legacy" else None)
            if level is not None:
                out[LOG_LEVEL_KEY] = level
        return out

    async def forward(self, scope: Scope, upstream: str, method: str, fwd: dict[str, Any],
                      meta: Mapping[str, Any], params: RoundParams, trip: RoundTrip | None,
                      relay: RelayHandler) -> dict[str, Any]:
        """Forward one request; for a handshake-era client, also fetch the input a modern upstream asks for.

        A modern client gets an upstream's ``input_required`` back (``input_required`` wraps its state) and
        retries on its own. A handshake-era client cannot: bastion asks it on the call's SSE stream, as the
        server-to-client requests it knows, and retries the upstream with the answers, within this one call.
        """
        out_meta = self._forward_meta(scope, upstream, meta)
        if out_meta:
            fwd["_meta"] = out_meta
        responses = params.get("inputResponses")
        if isinstance(responses, Mapping) and APPROVAL_INPUT_KEY in responses:
            # The answer to bastion's approval question is bastion's; the upstream never asked for it.
            responses = {k: v for k, v in responses.items() if k != APPROVAL_INPUT_KEY} or None
        if responses is not None:
            fwd["inputResponses"] = responses
        if trip is not None and trip.upstream_state is not None:
            fwd["requestState"] = trip.upstream_state
        result = await self.gw.forward(upstream, method, fwd, on_message=relay)
        rounds = 0
        while scope.era == "legacy" and is_input_required(result):
            rounds += 1
            if rounds > MAX_INPUT_ROUNDS:
                raise ToolError(f"The upstream asked for input more than {MAX_INPUT_ROUNDS} times; call abandoned")
            asked = cast(InputRequiredResult, result)
            answers = await self._ask_handshake_client(scope, upstream, asked.get("inputRequests"))
            if not answers:
                await asyncio.sleep(0.05 * rounds)  # state-only round: the upstream is still working
            fwd = {k: v for k, v in fwd.items() if k not in ("inputResponses", "requestState")}
            if answers:
                fwd["inputResponses"] = answers
            state = asked.get("requestState")
            if isinstance(state, str):
                fwd["requestState"] = state
            result = await self.gw.forward(upstream, method, fwd, on_message=relay)
        return result

    async def forward_once(self, scope: Scope, upstream: str, method: str, fwd: dict[str, Any],
                           meta: Mapping[str, Any], relay: RelayHandler) -> dict[str, Any]:
        """Forward a request that takes no rounds (``completion/complete``: the revision lets only ``tools/call``,
        ``prompts/get`` and ``resources/read`` answer ``input_required``). ``fwd`` must hold no round field
        (``state.ROUND_FIELDS``): the envelope is bastion's, declaring no input the client could give, and an
        ``input_required`` answer is refused rather than passed on with the upstream's bare state."""
        out_meta = self._forward_meta(scope, upstream, meta, rounds=False)
        if out_meta:
            fwd["_meta"] = out_meta
        result = await self.gw.forward(upstream, method, fwd, on_message=relay)
        if is_input_required(result):
            raise ProtocolError(INTERNAL_ERROR, f"The upstream answered {method} with input_required, which only "
                                "tools/call, prompts/get and resources/read may; nothing was relayed",
                                log_detail=f"upstream {upstream}")
        return result

    async def _ask_handshake_client(self, scope: Scope, upstream: str, requests: object) -> dict[str, Any]:
        if not isinstance(requests, Mapping):
            return {}
        responses: dict[str, Any] = {}
        for key, request in requests.items():
            kind = request.get("method") if isinstance(request, Mapping) else None
            capability = INPUT_CAPABILITY.get(kind) if isinstance(kind, str) else None
            if capability is None or capability not in scope.client_capabilities or \
                    isinstance(scope.emitter, NullEmitter):
                raise ToolError(f"The tool needs input from the client ({kind}) that this client cannot provide "
                                "on this request")
            assert isinstance(request, Mapping)
            try:
                responses[str(key)] = await scope.emitter.ask(
                    str(kind), self.gw.clean_notification(upstream, str(kind), jsonrpc.obj(request.get("params"))),
                    timeout=self.gw.client_request_timeout)
            except ProtocolError as exc:
                raise ToolError(f"The client did not provide the input the tool needs: {exc.message}") from None
        return responses

    def input_required(self, scope: Scope, method: str, target: str, params: RoundParams, upstream: str,
                       result: Mapping[str, Any], approval: str | None = None) -> dict[str, Any]:
        """An upstream's ``input_required`` for a modern client, its state sealed (see ``bastion.server.state``).

        Handshake-era clients never get here (``forward`` bridges tools/call for them).
        """
        if scope.era != "modern":
            raise ProtocolError(INTERNAL_ERROR, f"The upstream needs input from the client to answer {method}; "
                                "bastion relays such input to handshake-era clients only for tools/call")
        asked = cast(InputRequiredResult, result)
        requests = asked.get("inputRequests")
        missing = undeclared_inputs(requests, scope.client_capabilities)
        if missing:
            assert isinstance(requests, Mapping)  # only a mapping has keys to miss
            kinds = sorted({INPUT_CAPABILITY.get(str(jsonrpc.obj(requests[k]).get("method")), "?")
                            for k in missing} - {"?"})
            raise ProtocolError(MISSING_CLIENT_CAPABILITY,
                                "The upstream needs input of a kind this client did not declare",
                                data={"requiredCapabilities": {k: {} for k in kinds}}, http_status=400)
        state = asked.get("requestState")
        out: dict[str, Any] = {"resultType": "input_required"}
        if isinstance(requests, Mapping):
            # The questions reach a person or a model: upstream text like any other, and all of it (their keys,
            # every member of each request, ``_meta`` with credential keys redacted), walked once as the
            # questions for the client they are; nested one level down, so that the walk reaches the keys. A key
            # the walk rewrites comes back in the client's answer as rewritten: the upstream, which chose a key
            # with something to hide in it, asks again.
            out["inputRequests"] = self.gw.clean_notification(
                upstream, ELICITATION, {"inputRequests": dict(requests)})["inputRequests"]
        out["requestState"] = self.sealer.seal(
            principal_id=scope.principal.id, digest=request_digest(method, target, params), upstream=upstream,
            upstream_state=state if isinstance(state, str) else None, now=time.time(), approval=approval)
        return out


def approval_question(question: dict[str, Any]) -> dict[str, Any]:
    """The ``input_required`` result that asks bastion's own approval question instead of forwarding the call:
    the upstream sees the call only once the retry carries the user's yes."""
    return {"resultType": "input_required",
            "inputRequests": {APPROVAL_INPUT_KEY: {"method": ELICITATION, "params": question}}}


def approval_round(scope: Scope, params: RoundParams, trip: RoundTrip | None) -> ApprovalRound:
    """What this 2026-07-28 request says about bastion's approval question. Only a verified ``requestState``
    (bound to this principal and this exact request) can carry an answer or an earlier approval."""
    marker = trip.approval if trip is not None else None
    responses = params.get("inputResponses")
    answer = responses.get(APPROVAL_INPUT_KEY) if isinstance(responses, Mapping) else None
    asked = marker[4:] if marker is not None and marker.startswith("ask:") else None
    return ApprovalRound(can_ask="elicitation" in scope.client_capabilities, asked_rule=asked,
                         answer=dict(answer) if asked is not None and isinstance(answer, Mapping) else None,
                         approved_rule=marker[3:] if marker is not None and marker.startswith("ok:") else None)
