"""policyc's language server (`policyc lsp`, the `lsp` extra): the compiler's diagnostics as
you type, hover with a field's meaning and unit, completion of fields, names and units, go
to definition for models and rules, and formatting through `policyc fmt`.

`analysis.py` holds what the server answers, as plain functions over text (tested without
a client); `server.py` wires them to pygls over stdio; `reference.py` reads the field table
from the language reference that ships with the package (docs/language.md), so hover says
what the reference says.
"""
