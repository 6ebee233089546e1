"""The `frugal` command line: thin handlers, one module per subcommand.

Each handler parses its arguments, builds its component's Config and makes one library call;
every bench goes through the one path of `frugal.cli.bench`. Bad input (`ConfigError`) exits 2
and another `FrugalError` exits 1, each with one line on stderr; anything else is a bug and
shows its traceback.
"""
