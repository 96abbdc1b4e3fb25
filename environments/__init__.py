"""Concrete Environments (phased games, large societies) build on ``metaroles.Environment``."""
