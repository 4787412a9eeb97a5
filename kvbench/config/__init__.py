"""Declared settings, torch-free: typed fields with default, range and meaning (fields), strict
building from YAML values (strict), registries by name with entry points and did-you-mean
(registry), and what `kvbench list` shows of them (describe)."""
