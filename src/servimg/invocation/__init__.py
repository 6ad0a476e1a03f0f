"""One run of a command, at the command line's edge: the flags (`flags`) and the typed parameters the
arguments become (`params`), the outcomes a command yields (`outcome`), the context it runs with
(`context`), and the session that runs a parsed command and reports it (`session`, with `servimg.render`)."""
