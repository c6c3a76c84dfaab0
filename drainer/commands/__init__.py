"""The command line: `cli` parses it and runs a command; each command is a module of
its own, named after it (`drain`, `work`, `stats`, ...), holding its `cmd_*` and the
logic only it needs. `common` and `signals` hold what several commands share.

The library never imports this package: a drain in a function, or an application
that enqueues, starts without the command line.
"""
