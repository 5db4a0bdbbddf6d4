"""The `edgerun serve` process: the daemon and what it runs beside the pipeline."""
