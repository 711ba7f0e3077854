"""The command-line client: Typer app, fast entry path, renderers. Kept empty: start-up cost."""
