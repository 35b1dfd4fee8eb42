"""The admin page: its views in a browser, who may open it, its live views."""
