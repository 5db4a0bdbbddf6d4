"""Model updates: bundles, their download and install, the on-device model store."""
