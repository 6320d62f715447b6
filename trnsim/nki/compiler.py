"""``nki.compiler``: compiler hints (filled in by the nki.language work of issue 11)."""
