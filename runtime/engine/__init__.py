"""Engines and model files: backends, manifests, pre/post-processing, `models prepare`."""
