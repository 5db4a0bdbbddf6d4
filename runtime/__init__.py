"""edgerun runtime: backends, profiler, selector, CLI."""

__version__ = "0.1.0"
