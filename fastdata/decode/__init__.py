"""fastdata.decode."""
