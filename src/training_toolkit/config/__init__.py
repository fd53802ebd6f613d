"""The toolkit's own settings: every ``TRAINING_TOOLKIT_*`` variable once (``settings``), the parsers of their
values (``settings_values``) and the help text built from them (``settings_help``).
"""
