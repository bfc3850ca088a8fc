"""Test helpers: data generators and plain-Python references shared by the tests (importable as ``helpers``)."""
