"""The version of fastdata, in one place: the package, the CLI and the caches read it here."""

__version__ = "0.1.0"
