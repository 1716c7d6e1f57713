"""bastion: a security gateway for the Model Context Protocol."""

__version__ = "0.1.0"
