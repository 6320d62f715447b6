"""``nki.typing``: kernel parameter annotations (filled in by the nki.language work of issue 11)."""
