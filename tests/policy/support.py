from __future__ import annotations

import textwrap
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from bastion.policy.cases import tool_entry
from bastion.policy.decide import PolicySet
from bastion.policy.load import PolicyText, compile_policies
from bastion.principal import Principal
from bastion.tool_entry import ToolEntry


def policy(text: str, source: str = "test.yaml") -> PolicySet:
    return compile_policies([PolicyText(source, textwrap.dedent(text))])


def who(pid: str = "alice", *groups: str, **claims: Any) -> Principal:
    return Principal(id=pid, groups=frozenset(groups), attributes=MappingProxyType(claims))


def tool(name: str, upstream: str | None = None, annotations: Mapping[str, Any] | None = None) -> ToolEntry:
    return tool_entry(name, upstream, annotations)
