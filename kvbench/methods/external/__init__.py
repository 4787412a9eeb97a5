"""Adapters that run the field's own implementations unchanged (a kvpress press), so that the
figure kvbench reports is the one the library's own pipeline gets."""
