"""Power sensing and control for edgerun: meters, device profiles, governors."""
