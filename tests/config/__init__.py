"""Config keys: declared once, and everything made from the declarations."""
