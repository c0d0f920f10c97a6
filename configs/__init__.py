"""Experiment configs: one `get_config(arg)` per file (see README "Layout")."""
