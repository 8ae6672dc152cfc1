"""Small real programs standing in for external systems that cannot run on dev/CI machines."""
