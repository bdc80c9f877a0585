"""fastdata.tune."""
