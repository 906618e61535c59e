"""Initialization-scale interventions and representation geometry on deep networks."""
