"""See harness/__init__.py; each script here also runs standalone, by path."""
