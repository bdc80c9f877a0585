"""fastdata.gpu."""
