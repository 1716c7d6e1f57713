"""Schema validation of tool inputs and outputs, safe against hostile schemas. See ``docs/validation.md``."""

from bastion.validation.catalog import compile_catalogue
from bastion.validation.compile import CompiledSchema, SchemaRejected, ToolValidators, compile_tool
from bastion.validation.config import UpstreamValidation, ValidationConfig
from bastion.validation.guards import InputSchemaGuard, OutputMode, OutputSchemaGuard
from bastion.validation.limits import SchemaLimits
from bastion.validation.metrics import NoMetrics, ValidationMetrics
from bastion.validation.report import Report

__all__ = [
    "CompiledSchema",
    "InputSchemaGuard",
    "NoMetrics",
    "OutputMode",
    "OutputSchemaGuard",
    "Report",
    "SchemaLimits",
    "SchemaRejected",
    "ToolValidators",
    "UpstreamValidation",
    "ValidationConfig",
    "ValidationMetrics",
    "compile_catalogue",
    "compile_tool",
]
