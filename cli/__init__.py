"""The ``osprey`` command line: thin click wrappers around library ``run(config)`` functions."""
