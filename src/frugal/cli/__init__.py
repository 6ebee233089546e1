"""The `frugal` command line: thin handlers, one module per subcommand.

Each handler parses its arguments, builds its component's Config and makes one library call.
Bad input exits 2 and a `FrugalError` exits 1, each with one line on stderr.
"""
