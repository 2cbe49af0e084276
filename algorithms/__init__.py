"""Communication algorithms, each a :class:`commrt.Schedule` generator."""
