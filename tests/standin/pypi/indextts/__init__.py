"""Stand-in for the ``indextts`` package of the PyPI repackaging ``indextts2-inference``."""
