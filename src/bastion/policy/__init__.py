"""Access policy: YAML rules admins can review, check and test; a pure decision for every request."""

from bastion.policy.decide import PolicySet
from bastion.policy.load import load_policies
from bastion.policy.model import Decision, Rule

__all__ = ["Decision", "PolicySet", "Rule", "load_policies"]
