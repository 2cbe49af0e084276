"""Code shared by the test modules and their workers; no test imports another test module."""
