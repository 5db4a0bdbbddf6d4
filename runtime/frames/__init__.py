"""Frames from outside to stored results: sources, images, ROI, the pipeline."""
