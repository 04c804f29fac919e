"""marlctl: declarative experiments for multi-agent reinforcement learning."""

__version__ = "0.1.0"
