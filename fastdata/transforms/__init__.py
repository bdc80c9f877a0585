"""fastdata.transforms."""
