"""Prompt building and history matching: chat messages to prompt token IDs, reusing the tokens the
policy sampled earlier (``conversation``), the per-rollout memory of answered calls it reuses
(``history``), and what a request repeats of its rollout's previous one (``repeats``)."""
