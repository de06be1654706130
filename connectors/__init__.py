"""Connectors: the bridges between runwatch and the training processes it watches."""
