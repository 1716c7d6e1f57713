"""Schema validation of tool inputs and outputs, safe against hostile schemas. See ``docs/validation.md``.

The package's face: ``CompileSchemas`` (the view step compiling every tool's schemas once per catalogue version),
``InputSchemaGuard``/``OutputSchemaGuard`` (the pipeline's guards) and ``validators_for`` (how the guards find a
tool's compiled validators in the current view).
"""

from bastion.validation.compile import CompiledSchema, SchemaRejected, ToolValidators, compile_tool
from bastion.validation.compile_all import compile_catalogue
from bastion.validation.config import UpstreamValidation, ValidationConfig
from bastion.validation.guards import InputSchemaGuard, OutputMode, OutputSchemaGuard
from bastion.validation.limits import SchemaLimits
from bastion.validation.metrics import NoMetrics, ValidationMetrics
from bastion.validation.report import Report
from bastion.validation.view_step import VALIDATORS, CompileSchemas, validators_for

__all__ = [
    "VALIDATORS",
    "CompileSchemas",
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
    "validators_for",
]
