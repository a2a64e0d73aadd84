"""Circuit discovery over datasets."""
