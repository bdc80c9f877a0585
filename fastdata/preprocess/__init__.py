"""fastdata.preprocess."""
