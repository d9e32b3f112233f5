"""Outputs, the bottom layer: atomic files, manifests, the machine stamp, logging."""
