"""Output sanitization: hidden text, secrets, prompt-injection markers, size and type limits.

The package's face, one entry per place upstream text reaches a client: ``SanitizeGuard`` (tool results, the
last response guard, after ``ResultShapeGuard``), ``SanitizeDefinitions`` (tool, prompt and resource
definitions and instructions, a view step) and ``UpstreamTextCleaner`` (notifications, error messages and
forwarded prompt/resource/completion results). All judge under ``SanitizeConfig``.
"""

from bastion.sanitize.config import SanitizeConfig
from bastion.sanitize.guard import SanitizeGuard
from bastion.sanitize.shape import ResultShapeGuard
from bastion.sanitize.upstream_text import UpstreamTextCleaner
from bastion.sanitize.view_step import SanitizeDefinitions

__all__ = ["ResultShapeGuard", "SanitizeConfig", "SanitizeDefinitions", "SanitizeGuard", "UpstreamTextCleaner"]
