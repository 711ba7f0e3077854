"""Man page and shell completions generated from the Typer app."""
