"""Data sets, generated images and named data sources for the CLI."""
