"""harnessrl: reinforcement learning for LLM agents inside their real, unmodified harnesses."""

__version__ = "0.1.0"
