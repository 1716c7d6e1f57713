"""Upstream health: a pure state machine (``machine``), its settings (``config``) and the monitor that feeds it
from passive signals and an active probe (``monitor``)."""

from bastion.health.config import HealthConfig
from bastion.health.machine import Health, HealthState
from bastion.health.monitor import HealthMonitor

__all__ = ["Health", "HealthConfig", "HealthMonitor", "HealthState"]
