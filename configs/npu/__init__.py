"""Hardware presets (TOML). This folder is installed as the package data of ``npujax.presets``."""
