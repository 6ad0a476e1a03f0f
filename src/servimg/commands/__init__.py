"""One library function per `servimg` command, with typed parameters and a result value.

Every decision the command line used to make lives here (or in the stage module it belongs to): which
build a `--sign` asks for, the ladder's default paths and variables, the policy the flags add up to,
whether two images are compared by their files or by their provenance. `servimg.cli` only parses, turns
its arguments into one of the parameter values (`params`), loads the command's module and calls it, and
renders the `Outcome`s (`session`).

A command yields one `Outcome` per target, as each finishes (a build of three definitions says OK for
the first while the second builds). A target that fails is an outcome with its error, never an
exception: the other targets still run, and the exit status counts the failures.

Why a package of small modules: a command imports only what it needs. `servimg --help` imports only
`params` (the standard library); `servimg build` loads `servimg.commands.build` (the build pipeline,
not the provenance stack, the ladder or the Debian base builder). This package's `__init__` imports
nothing, so importing any one module of it costs only that module.
"""
