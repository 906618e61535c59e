"""The ``ftlab`` command line: one module per command group, loaded lazily."""
