"""runnerd: a self-hosted runner for code tools."""

__version__ = "0.1.0"
