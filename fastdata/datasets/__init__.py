"""fastdata.datasets."""
