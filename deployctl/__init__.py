"""deployctl: put an LLM inference service into production and take it back out."""
__version__ = "0.1.0"
