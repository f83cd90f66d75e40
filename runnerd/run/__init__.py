"""One run of a tool, without governance: the runner, the jail, package environments,
runtimes, cgroups and secret scrubbing."""
