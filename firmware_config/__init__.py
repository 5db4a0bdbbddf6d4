"""Device profiles and example configs (data package)."""
