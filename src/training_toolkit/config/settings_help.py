"""The texts made from the settings' table (``settings.VARIABLES``): ``--help`` lines and README's table.

``python -m training_toolkit.config.settings_help`` prints README's settings table;
test/unit/config/test_settings.py checks that README holds it as printed.
"""

from __future__ import annotations

from training_toolkit.config.settings import VARIABLES, variable


def help_text(field: str) -> str:
    """A flag's ``--help`` line: the variable's doc, and where its default comes from."""
    var = variable(field)
    return f"{_plain(var.doc)} (default: ${var.name}, else {_plain(var.shown_default)})"


def environment_help() -> str:
    """Every variable, for the end of ``--help``."""
    lines = ["settings (environment variables; an empty one counts as unset):"]
    for var in VARIABLES:
        lines += [f"  {var.name} (default: {_plain(var.shown_default)})", f"      {_plain(var.doc)}"]
    return "\n".join(lines)


def _plain(text: str) -> str:
    return text.replace("`", "")


def markdown_table() -> str:
    """README's settings table."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for var in VARIABLES:
        meaning = var.doc + (f" (`{var.flag}` wins)" if var.flag else "")
        rows.append(f"| `{var.name}` | {var.shown_default} | {meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
