"""Tools around the product: the demo, simulators, installers, the day report."""
