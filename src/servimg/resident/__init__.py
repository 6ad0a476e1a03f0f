"""The resident server: a `servimg` process kept warm, so a command costs its work, not Python's start and
servimg's imports (issue 13: ≈0.25 s of a 0.7 s build of the demo; docs/architecture.md, "The resident
server").

`servimg` (the console script, `python -m servimg`) is `resident.client.main`: it asks the server of its
own environment to run the command, and runs it in-process when none answers (leaving a server behind
for the next command). The server (`resident.server`) has imported the CLI and the common commands once;
for each request it forks a worker that takes the client's argv, environment, working directory, umask
and standard streams, runs `servimg.cli.main` exactly as the client would have, and exits; the client
exits with the worker's status and forwards the signals it receives to the worker's process group.

A worker shares with its server everything a process fixes at its start (the interpreter and its flags,
`sys.path`, the servimg code imported, the locale, LD_PRELOAD, credentials, cgroup, namespaces, resource
limits): `resident.identity` names that environment, and a client only talks to the server whose name is
its own. `SERVIMG_SERVER=0` runs every command in-process; a batch job (Slurm) always does.
"""
